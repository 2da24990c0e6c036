"""A NodePlan as the files nodeagent applies as they are, and as a report. Pure.

- the sharing config (nodeagent/v1): `nodeagent sharing apply -f FILE -c NAME`;
- when no GPU uses MPS, the same as a mig-parted v1 config: `nodeagent mig apply`;
- the report: GPUs used and left whole, memory and SMs stranded, workloads not placed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from nodeagent.base.logs import printable
from nodeagent.nvml.inventory import Gpu
from nodeagent.planner.options import ceil_percent
from nodeagent.planner.planner import NodePlan
from nodeagent.planner.workloads import Workload

MIB = 1 << 20


def _entries(plan: NodePlan) -> list[tuple[dict[str, Any], list[int]]]:
    """One entry per distinct sharing, with the GPUs that get it (in index order)."""
    groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for g in plan.gpus:
        body: dict[str, Any]
        if g.strategy == "mig":
            body = {"mig": {"mig-devices": dict(g.mig_devices)}}
        elif g.strategy == "mps":
            assert plan.mps_replicas is not None and g.pinned_mib is not None
            mps: dict[str, Any] = {"replicas": plan.mps_replicas}
            if plan.thread_percentage is not None:
                mps["thread-percentage"] = plan.thread_percentage
            mps["pinned-memory"] = f"{g.pinned_mib}M"
            body = {"mps": mps}
        else:
            body = {"whole": {}}
        key = json.dumps(body, sort_keys=True)
        groups.setdefault(key, (body, []))[1].append(g.gpu)
    return list(groups.values())


def sharing_document(plan: NodePlan, name: str) -> dict[str, Any]:
    entries = [{"devices": gpus, **body} for body, gpus in _entries(plan)]
    return {"version": "nodeagent/v1", "sharing-configs": {name: entries}}


def mig_parted_document(plan: NodePlan, name: str) -> dict[str, Any] | None:
    """The plan as a mig-parted v1 config; None when a GPU uses MPS (mig-parted has no MPS)."""
    if plan.uses_mps:
        return None
    entries: list[dict[str, Any]] = []
    for body, gpus in _entries(plan):
        if "mig" in body:
            entries.append(
                {"devices": gpus, "mig-enabled": True, "mig-devices": body["mig"]["mig-devices"]}
            )
        else:
            entries.append({"devices": gpus, "mig-enabled": False})
    return {"version": "v1", "mig-configs": {name: entries}}


def report(plan: NodePlan, name: str) -> dict[str, Any]:
    """Everything, JSON-ready (`nodeagent plan --output json`)."""
    return {
        "assignment": [
            {
                "workload": p.workload,
                "replica": p.replica,
                "gpu": p.gpu,
                "mode": p.mode,
                **({"profile": p.profile} if p.profile else {}),
                **(
                    {"placement": {"start": p.placement.start, "size": p.placement.size}}
                    if p.placement
                    else {}
                ),
            }
            for p in plan.placed
        ],
        "gpus": [
            {
                "gpu": g.gpu,
                "name": g.name,
                "sharing": g.strategy,
                "used": g.used,
                **({"mig-devices": dict(g.mig_devices)} if g.strategy == "mig" else {}),
                **({"pinned-memory": f"{g.pinned_mib}M"} if g.pinned_mib else {}),
            }
            for g in plan.gpus
        ],
        "mps": (
            {"replicas": plan.mps_replicas, "thread-percentage": plan.thread_percentage}
            if plan.mps_replicas
            else None
        ),
        "report": {
            "exact": plan.exact,
            "replicas_placed": len(plan.placed),
            "gpus_used": plan.gpus_used,
            "gpus_left_whole": list(plan.gpus_whole),
            "memory_stranded_bytes": plan.memory_stranded_bytes,
            "sms_stranded": plan.sms_stranded,
            "not_placed": [
                {"workload": n.workload, "replicas": n.replicas, "reason": n.reason}
                for n in plan.not_placed
            ],
        },
        "sharing_config": sharing_document(plan, name),
        "mig_config": mig_parted_document(plan, name),
    }


def summary_lines(plan: NodePlan) -> list[str]:
    """The report in a few lines (also the comment atop the YAML output). Workload names are
    shown escaped: a line or paragraph separator (U+2028) would end a YAML comment and turn the
    rest of the name into a key of the document; a control character would reach a terminal."""
    return [printable(line) for line in _summary(plan)]


def _summary(plan: NodePlan) -> list[str]:
    lines = []
    for g in plan.gpus:
        on = [p for p in plan.placed if p.gpu == g.gpu]
        if not g.used:
            lines.append(f"GPU {g.gpu}: left whole")
            continue
        what = ", ".join(
            f"{p.workload}#{p.replica}" + (f" on {p.profile}@{p.placement}" if p.profile else "")
            for p in on
        )
        how = g.strategy
        if g.strategy == "mps":
            how += f" x{plan.mps_replicas}, {g.pinned_mib}M each"
            if plan.thread_percentage is not None:
                how += f", {plan.thread_percentage}% threads"
        lines.append(f"GPU {g.gpu}: {how}: {what or 'slices kept'}")
    lines.append(
        f"placed {len(plan.placed)} replicas on {plan.gpus_used} of {len(plan.gpus)} GPUs;"
        f" {len(plan.gpus_whole)} left whole; memory stranded"
        f" {plan.memory_stranded_bytes // MIB} MiB; SMs stranded {plan.sms_stranded}"
    )
    for n in plan.not_placed:
        lines.append(f"not placed: {n.workload} x{n.replicas}: {n.reason}")
    if not plan.exact:
        lines.append(
            "not exact: too many kinds of workloads to search every combination; a greedy plan"
            " (GPU by GPU, the most placed first)"
        )
    return lines


def render_yaml(plan: NodePlan, name: str) -> str:
    """The sharing config, the report as comments above it."""
    head = "".join(f"# {line}\n" for line in summary_lines(plan))
    return head + _dump(sharing_document(plan, name))


def render_mig_parted(plan: NodePlan, name: str) -> str | None:
    doc = mig_parted_document(plan, name)
    if doc is None:
        return None
    head = "".join(f"# {line}\n" for line in summary_lines(plan))
    return head + _dump(doc)


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def shortfall(
    plan: NodePlan, workloads: Sequence[Workload], gpus: Sequence[Gpu], percent_step: int = 1
) -> str | None:
    """One line for a plan that leaves replicas out (None when all are placed), naming the
    resource that ran out: a replica bigger than any place, the GPUs (exclusive replicas), the
    GPUs' memory, their compute (shared replicas' needs rounded up to `percent_step` percent,
    as the plan counted them), or else the MIG layouts (memory and compute would do in total,
    but no layout of the slices holds them all)."""
    if not plan.not_placed:
        return None
    left = sum(n.replicas for n in plan.not_placed)
    total = sum(w.replicas for w in workloads)
    head = f"{left} of {total} replicas do not fit this node"
    too_big = [n.workload for n in plan.not_placed if n.reason.startswith("too big")]
    memory_mib = sum(g.memory_total_bytes for g in gpus) >> 20
    need_mib = sum(w.replicas * w.memory_mib for w in workloads)
    compute = sum(w.replicas * _counted(w, percent_step) for w in workloads if w.compute)
    exclusive = sum(w.replicas for w in workloads if w.isolation == "exclusive")
    if too_big:
        why = f"{', '.join(printable(n) for n in too_big)}: bigger than any slice or GPU here"
    elif exclusive > len(gpus):
        why = f"GPUs: {exclusive} exclusive replicas, {len(gpus)} GPUs"
    elif need_mib > memory_mib:
        why = (
            f"GPU memory: the replicas need {need_mib >> 10} GiB,"
            f" the GPUs have {memory_mib >> 10} GiB"
        )
    elif compute > len(gpus):
        why = f"compute: the replicas need {compute:g} GPUs of compute, the node has {len(gpus)}"
        if percent_step > 1 and any(w.isolation == "shared" and w.compute for w in workloads):
            why += f" (a shared replica's compute counted in {percent_step} % steps, rounded up)"
    else:
        why = (
            "MIG layouts: memory and compute would do in total, but no layout of the GPUs'"
            " slices holds every replica"
        )
    return f"{head}; ran out of {why}"


def _counted(w: Workload, percent_step: int) -> float:
    """The compute need of one replica as the plan counts it (a shared one's in steps)."""
    assert w.compute is not None
    if w.isolation != "shared" or percent_step == 1:
        return w.compute
    return -(-ceil_percent(w.compute) // percent_step) * percent_step / 100
