"""`nodeagent sharing apply|assert|export`: the per-GPU sharing config (nodeagent/v1) by hand,
through the agent's own pipeline (one run), with mig-parted's flags and exit codes."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from nodeagent.cli.common import Context, add_setting_flags, output_flag, print_json

if TYPE_CHECKING:
    from nodeagent.reconcile import Report

SHARING_FLAG_NAMES = {
    "sharing.config-file": ("-f", "--file"),
    "sharing.config": ("-c", "--config"),
    "mig.config-file": ("--mig-file",),  # the mig-parted file `mig-config: NAME` entries name
}
GROUPS = ("node", "mig", "mps", "sharing")


def _print(ctx: Context, report: Report, dry_run: bool) -> None:
    from nodeagent.cli.pipelines import describe_op

    name = report.wanted.sharing_config
    if ctx.args.output == "json":
        print_json({
            "config": name,
            "dry_run": dry_run,
            "operations": [op.to_dict() for op in report.done],
            "mps": report.mps_change,
            "gpus": {str(i): {"sharing": s, "replicas": n} for i, (s, n) in report.sharing.items()},
        })  # fmt: skip
        return
    for op in report.done:
        print(describe_op(op))
    if report.mps_change == "adopt":  # it runs as wanted: taken over, not changed
        print("MPS daemon: runs as the config says, unchanged")
    elif report.mps_change != "none":
        print(f"MPS daemon: {report.mps_change}{' (planned)' if dry_run else ''}")
    for index, (strategy, replicas) in sorted(report.sharing.items()):
        extra = f" x{replicas}" if strategy in ("mps", "time-slicing") else ""
        print(f"GPU {index}: {strategy}{extra}")
    verb = "would run" if dry_run else "ran"
    n = len(report.done)
    unchanged = "; nothing to change" if not n and report.mps_change in ("none", "adopt") else ""
    print(f"sharing config {name!r}: {verb} {n} NVML operation{'s' if n != 1 else ''}{unchanged}")


def cmd_sharing_apply(ctx: Context) -> int:
    from nodeagent.cli.pipelines import failed, sharing_pipeline

    report = sharing_pipeline(ctx).run_once(dry_run=ctx.args.dry_run)
    failed(report)
    _print(ctx, report, ctx.args.dry_run)
    if ctx.args.dry_run and ctx.args.output != "json":
        _print_label_changes(ctx, report)
    return 0


def _print_label_changes(ctx: Context, report: Report) -> None:
    """The per-GPU labels the plan changes (what GPUs show now: MIG, an MPS daemon, whole)."""
    from nodeagent.cli.status import current_sharing
    from nodeagent.labels.render import GPU_SHARING_PREFIX
    from nodeagent.nvml import read_inventory

    now = current_sharing(read_inventory(ctx.session))
    for index, (strategy, _replicas) in sorted(report.sharing.items()):
        before = now.get(index, "whole")
        if before != strategy:
            print(f"label {GPU_SHARING_PREFIX}{index}.sharing: {before} -> {strategy}")


def cmd_sharing_assert(ctx: Context) -> int:
    """Exit 0 when the node is as the config says (no MIG operation, no MPS change needed)."""
    from nodeagent.cli.pipelines import failed, sharing_pipeline

    report = sharing_pipeline(ctx).run_once(compare=True)
    failed(report)
    name = report.wanted.sharing_config
    differences = [f"GPU {d.op.gpu}: needs {d.op.op.value}" for d in report.done]
    if report.mps_change not in ("none", "adopt"):  # adopt: it runs as wanted already
        differences.append(f"the MPS daemon needs: {report.mps_change}")
    for line in differences:
        print(line)
    if differences:
        return 1
    print(f"sharing config {name!r}: the GPUs match")
    return 0


def cmd_sharing_export(ctx: Context) -> int:
    """What each GPU offers now, as a sharing config named `current`
    (nodeagent.sharing.export): MPS as the daemon in the configured MPS root runs, its limits
    read back, so that applying the export changes nothing."""
    import yaml

    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.intent import mps_daemon_settings
    from nodeagent.mps.settings import Limits
    from nodeagent.nvml import read_inventory
    from nodeagent.sharing.export import RunningMps, export_sharing

    inventory = read_inventory(ctx.session)
    daemon = MpsDaemon(mps_daemon_settings(ctx.settings.mps, ()), Limits(0, {}, ""))
    by_uuid = {g.uuid: g.index for g in inventory.gpus}
    served = [by_uuid.get(u) for u in daemon.control.served_devices()]
    running = RunningMps()
    if any(i is not None for i in served):
        pct, pinned = daemon.read_back()  # by the daemon's device order: its GPUs' order
        running = RunningMps(
            tuple(i for i in served if i is not None),
            pct,
            {i: pinned.get(n) for n, i in enumerate(served) if i is not None},
        )
    doc = export_sharing(inventory, running)
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    return 0


def add_sharing_parser(sub: Any) -> None:
    sharing = sub.add_parser("sharing", help="per-GPU sharing: MIG here, MPS there, time-slicing")
    ssub = sharing.add_subparsers(dest="sharing_command", metavar="SHARINGCOMMAND")
    ssub.required = True
    p = ssub.add_parser("apply", help="bring every GPU to what the config says for it")
    add_setting_flags(
        p,
        ["sharing"],
        SHARING_FLAG_NAMES,
        skip=["sharing.plugin-config-out", "sharing.workload-file"],
    )
    add_setting_flags(
        p,
        ["mig", "mps"],
        SHARING_FLAG_NAMES,
        skip=["mig.config", "mps.enabled", "mps.stop-on-exit"],
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    output_flag(p)
    p.set_defaults(func=cmd_sharing_apply, groups=(*GROUPS, "dra"))  # the DRA claims: held
    p = ssub.add_parser("assert", help="exit 0 when the GPUs are as the config says, 1 when not")
    add_setting_flags(
        p,
        ["sharing"],
        SHARING_FLAG_NAMES,
        skip=["sharing.plugin-config-out", "sharing.workload-file"],
    )
    add_setting_flags(
        p,
        ["mig", "mps"],
        SHARING_FLAG_NAMES,
        skip=["mig.config", "mps.enabled", "mps.stop-on-exit"],
    )
    output_flag(p)
    p.set_defaults(func=cmd_sharing_assert, groups=GROUPS)
    p = ssub.add_parser("export", help="what each GPU offers now, as a config named 'current'")
    add_setting_flags(p, ["mps"], skip=["mps.enabled", "mps.stop-on-exit"])
    p.set_defaults(func=cmd_sharing_export, groups=("node", "mps"))
