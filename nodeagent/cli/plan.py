"""`nodeagent plan -f workloads.yaml`: the sharing layout that serves these workloads on this
node's GPUs (read through NVML, or the emulator with --simulate). Changes nothing.

--output text        the assignment and the report (default)
--output yaml        the sharing config (nodeagent/v1), the report as comments above it:
                     `nodeagent sharing apply -f FILE -c NAME` applies it as it is
--output mig-parted  the same as a mig-parted v1 config (when no GPU uses MPS)
--output json        everything: assignment, per-GPU sharing, report, both configs
--output dra         the DRA side: a ResourceClaimTemplate per workload (an MPS share sized
                     from its compute and memory, a MIG slice or a whole GPU), planned with
                     share requests rounded up as the scheduler counts them: `kubectl apply`

Exit 0 when every replica is placed; 1 when some are not (the plan is printed all the same,
then one line on stderr naming the resource that ran out); 2 for a bad workload file (with
--output dra also for workload names that make no claim template name, or the same one).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.cli.common import Context, print_json

DEFAULT_NAME = "planned"


def cmd_plan(ctx: Context) -> int:
    from nodeagent.dra.capacity import SM_STEP_PERCENT
    from nodeagent.nvml import read_inventory
    from nodeagent.planner.planner import plan_node
    from nodeagent.planner.render import (
        render_mig_parted,
        render_yaml,
        report,
        shortfall,
        summary_lines,
    )
    from nodeagent.planner.workloads import load_workloads

    name = ctx.args.name
    if not name or not name.strip():
        raise ConfigError("--name must be a config name, not empty")
    workloads = load_workloads(ctx.args.file)
    inventory = read_inventory(ctx.session)
    if not inventory.gpus:
        raise ConfigError("this node has no GPU to plan for")
    progress = sys.stderr.isatty()  # a terminal sees the search start and end; a pipe does not
    if progress:
        replicas = sum(w.replicas for w in workloads.workloads)
        print(
            f"planning {replicas} replicas of {len(workloads.workloads)} workloads on"
            f" {len(inventory.gpus)} GPUs ...",
            file=sys.stderr,
            flush=True,
        )
    began = time.monotonic()
    output = ctx.args.output
    # The scheduler counts a DRA share's sm request in steps: plan with the rounded requests.
    step = SM_STEP_PERCENT if output == "dra" else 1
    plan = plan_node(inventory, workloads.workloads, step)
    if progress:
        print(f"planned in {time.monotonic() - began:.2f} s", file=sys.stderr)
    if output == "json":
        print_json(report(plan, name))
    elif output == "yaml":
        sys.stdout.write(render_yaml(plan, name))
    elif output == "mig-parted":
        text = render_mig_parted(plan, name)
        if text is None:
            gpus = ", ".join(str(g.gpu) for g in plan.gpus if g.strategy == "mps")
            raise ConfigError(
                f"the plan shares GPU {gpus} through MPS, which a mig-parted config cannot say;"
                " use --output yaml (the nodeagent/v1 sharing config)"
            )
        sys.stdout.write(text)
    elif output == "dra":
        from nodeagent.dra.plans import render_claims

        driver = ctx.settings.dra.driver
        sys.stdout.write(render_claims(plan, workloads.workloads, inventory.gpus, driver))
    else:
        for line in summary_lines(plan):
            print(line)
    short = shortfall(plan, workloads.workloads, inventory.gpus, step)
    if short is not None:  # the plan is printed all the same; a script sees the exit code
        print(f"nodeagent: {short}", file=sys.stderr)
        return 1
    return 0


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan", help="the sharing layout that serves a workload file on this node (changes nothing)"
    )
    p.add_argument(
        "-f", "--file", required=True, help="the workload file (nodeagent/v1); - is stdin"
    )
    p.add_argument("--name", default=DEFAULT_NAME, help="name of the planned config")
    p.add_argument(
        "--output", "-o", choices=("text", "yaml", "json", "mig-parted", "dra"), default="text",
        help="output format (dra: ResourceClaimTemplates for the DRA driver)",
    )  # fmt: skip
    p.set_defaults(func=cmd_plan, groups=("node", "dra"))
