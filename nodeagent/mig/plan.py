"""The minimal transition plan from the current slices to the desired counts. Pure.

For each GPU the target layout is chosen among every valid layout with the desired counts
that keeps all in-use slices, minimising NVML mutations (destroying a slice costs one call per
CI plus one for its GI; creating costs two; finishing a GI left without its CI costs one).
Operations are ordered: set MIG mode (enable), destroy CIs, destroy GIs, set MIG mode
(disable), create GIs at explicit placements, create their CIs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.errors import GeometryInvalid, SliceInUse
from nodeagent.mig.geometry import Geometry, Instance, Layout
from nodeagent.mig.select import Desired, describe
from nodeagent.nvml.inventory import Gpu, Inventory, Placement, Slice


@dataclass(frozen=True)
class Operation:
    op: str  # set-mig-mode | destroy-ci | destroy-gi | create-gi | create-ci
    gpu: int
    profile: str | None = None
    profile_id: int | None = None
    placement: Placement | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    enabled: bool | None = None
    slice_count: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "gpu": self.gpu}
        if self.enabled is not None:
            out["enabled"] = self.enabled
        if self.profile is not None:
            out["profile"] = self.profile
        if self.placement is not None:
            out["placement"] = {"start": self.placement.start, "size": self.placement.size}
        if self.gi_id is not None:
            out["gi_id"] = self.gi_id
        if self.ci_id is not None:
            out["ci_id"] = self.ci_id
        return out

    @property
    def mutates(self) -> bool:
        return True


@dataclass(frozen=True)
class GpuPlan:
    gpu: int
    operations: tuple[Operation, ...]
    target: Layout = ()
    kept: tuple[int, ...] = ()  # GI ids kept as they are


@dataclass(frozen=True)
class Plan:
    gpus: tuple[GpuPlan, ...] = field(default_factory=tuple)

    @property
    def operations(self) -> tuple[Operation, ...]:
        return tuple(op for g in self.gpus for op in g.operations)

    @property
    def mutations(self) -> int:
        return len(self.operations)

    def to_dict(self) -> dict[str, Any]:
        return {"operations": [op.to_dict() for op in self.operations]}


@dataclass(frozen=True)
class _Gi:
    """One existing GPU instance and its compute instances (from the Inventory's slices)."""

    gi_id: int
    profile_id: int
    profile: str
    placement: Placement
    ci_ids: tuple[int, ...]
    slices: tuple[Slice, ...]
    holders: tuple[str, ...]  # who uses it: "pid 1234", "pod ns/name"

    @property
    def instance(self) -> Instance:
        return Instance(self.placement.start, self.placement.size, self.profile_id)

    @property
    def in_use(self) -> bool:
        return bool(self.holders)

    @property
    def destroy_cost(self) -> int:
        return len(self.ci_ids) + 1

    def describe(self, gpu: int) -> str:
        uuids = ", ".join(s.mig_uuid for s in self.slices if s.mig_uuid) or "no MIG UUID"
        return (
            f"GPU {gpu} slice {self.profile} (GI {self.gi_id}, placement {self.placement},"
            f" {uuids}) is in use by {', '.join(self.holders)}"
        )


def existing_instances(gpu: Gpu, in_use: Mapping[str, str] | None = None) -> list[_Gi]:
    """Group the GPU's slices by GPU instance, with who holds each."""
    in_use = in_use or {}
    by_gi: dict[int, list[Slice]] = {}
    for s in gpu.slices:
        by_gi.setdefault(s.gi_id, []).append(s)
    gis = []
    for gi_id, slices in sorted(by_gi.items()):
        first = slices[0]
        holders: list[str] = []
        for s in slices:
            holders += [f"pid {p.pid}" for p in s.processes]
            if s.mig_uuid and s.mig_uuid in in_use:
                holders.append(in_use[s.mig_uuid])
        gis.append(
            _Gi(
                gi_id=gi_id,
                profile_id=first.profile_id,
                profile=first.profile,
                placement=first.placement,
                ci_ids=tuple(s.ci_id for s in slices if s.ci_id is not None),
                slices=tuple(slices),
                holders=tuple(holders),
            )
        )
    return gis


def _cost(target: Layout, existing: dict[Instance, _Gi]) -> int:
    """NVML mutations to go from `existing` to `target` (kept GIs with one CI cost nothing)."""
    keep = {inst for inst in target if inst in existing and len(existing[inst].ci_ids) <= 1}
    cost = sum(gi.destroy_cost for inst, gi in existing.items() if inst not in keep)
    cost += 2 * (len(target) - len(keep))
    return cost + sum(1 for inst in keep if not existing[inst].ci_ids)


def choose_target(
    geometry: Geometry, counts: Mapping[int, int], existing: list[_Gi]
) -> tuple[Layout, int] | None:
    """The cheapest valid layout with `counts` keeping every in-use GI; None if there is none."""
    by_inst = {gi.instance: gi for gi in existing}
    required = [gi.instance for gi in existing if gi.in_use]
    best: tuple[Layout, int] | None = None
    for layout in geometry.layouts(counts, required):
        cost = _cost(layout, by_inst)
        if best is None or cost < best[1]:
            best = (layout, cost)
            if cost == 0:
                break
    return best


def _blockers(geometry: Geometry, counts: Mapping[int, int], existing: list[_Gi]) -> list[_Gi]:
    """The in-use GIs that stand in the way: those left out of the layout keeping the most."""
    busy = [gi for gi in existing if gi.in_use]
    best: set[Instance] = set()
    for layout in geometry.layouts(counts):
        kept = {gi.instance for gi in busy} & set(layout)
        if len(kept) > len(best):
            best = kept
    return [gi for gi in busy if gi.instance not in best]


def _destroy(gpu: int, gis: list[_Gi]) -> list[Operation]:
    """Destroy every CI of these GIs, then the GIs (NVML refuses a GI that still has CIs)."""
    ops = [
        Operation("destroy-ci", gpu, gi.profile, gi.profile_id, gi.placement, gi.gi_id, ci)
        for gi in gis
        for ci in gi.ci_ids
    ]
    ops += [
        Operation("destroy-gi", gpu, gi.profile, gi.profile_id, gi.placement, gi.gi_id)
        for gi in gis
    ]
    return ops


def plan_gpu(gpu: Gpu, want: Desired, in_use: Mapping[str, str] | None = None) -> GpuPlan:
    """The operations that bring one GPU to `want`. Raises SliceInUse or GeometryInvalid."""
    existing = existing_instances(gpu, in_use) if gpu.mig_current else []
    if not want.mig_enabled:
        busy = [gi for gi in existing if gi.in_use]
        if busy:
            raise SliceInUse(
                f"cannot disable MIG on GPU {gpu.index}: "
                + "; ".join(gi.describe(gpu.index) for gi in busy)
                + "; nothing was changed"
            )
        ops = _destroy(gpu.index, existing)
        if gpu.mig_current or gpu.mig_pending:
            ops.append(Operation("set-mig-mode", gpu.index, enabled=False))
        return GpuPlan(gpu.index, tuple(ops))
    ops = []
    if not (gpu.mig_current and gpu.mig_pending):
        ops.append(Operation("set-mig-mode", gpu.index, enabled=True))
    geometry = Geometry.of(gpu)
    chosen = choose_target(geometry, want.counts, existing)
    if chosen is None:
        names = want.named_counts(gpu)
        blockers = _blockers(geometry, want.counts, existing)
        if blockers:
            raise SliceInUse(
                f"GPU {gpu.index} cannot reach {describe(names)} without destroying a slice in"
                " use: "
                + "; ".join(gi.describe(gpu.index) for gi in blockers)
                + "; nothing was changed"
            )
        raise GeometryInvalid(
            f"GPU {gpu.index} ({gpu.name}) has no valid layout for {describe(names)}"
        )
    target, _ = chosen
    by_inst = {gi.instance: gi for gi in existing}
    kept = [by_inst[i] for i in target if i in by_inst and len(by_inst[i].ci_ids) <= 1]
    kept_ids = {gi.gi_id for gi in kept}
    ops += _destroy(gpu.index, [gi for gi in existing if gi.gi_id not in kept_ids])
    new = [inst for inst in target if not (inst in by_inst and by_inst[inst].gi_id in kept_ids)]
    profiles = {p.id: p for p in gpu.profiles}
    for inst in new:
        p = profiles[inst.profile_id]
        ops.append(Operation("create-gi", gpu.index, p.name, p.id, inst.placement))
    for gi in kept:
        if not gi.ci_ids:
            p = profiles[gi.profile_id]
            ops.append(
                Operation(
                    "create-ci",
                    gpu.index,
                    p.name,
                    p.id,
                    gi.placement,
                    gi.gi_id,
                    slice_count=p.slice_count,
                )
            )
    for inst in new:
        p = profiles[inst.profile_id]
        ops.append(
            Operation(
                "create-ci", gpu.index, p.name, p.id, inst.placement, slice_count=p.slice_count
            )
        )
    return GpuPlan(gpu.index, tuple(ops), target, tuple(sorted(kept_ids)))


def plan(
    inventory: Inventory, desired: Mapping[int, Desired], in_use: Mapping[str, str] | None = None
) -> Plan:
    """Plan every GPU in `desired`; GPUs not in it, or already matching, get no operation.

    All GPUs are planned before anything runs, so a refusal on one changes none.
    """
    plans = []
    for gpu in inventory.gpus:
        if gpu.index in desired:
            plans.append(plan_gpu(gpu, desired[gpu.index], in_use))
    return Plan(tuple(plans))


def mismatches(inventory: Inventory, desired: Mapping[int, Desired]) -> list[str]:
    """How the GPUs differ from `desired` (empty when they match): `mig assert` and the
    check after every apply."""
    problems = []
    for gpu in inventory.gpus:
        want = desired.get(gpu.index)
        if want is None:
            continue
        if (gpu.mig_current, gpu.mig_pending) != (want.mig_enabled, want.mig_enabled):
            state = "enabled" if gpu.mig_current else "disabled"
            if gpu.mig_pending != gpu.mig_current:
                state += f" (pending {'enabled' if gpu.mig_pending else 'disabled'})"
            problems.append(
                f"GPU {gpu.index}: MIG mode is {state}, wanted"
                f" {'enabled' if want.mig_enabled else 'disabled'}"
            )
            continue
        if not want.mig_enabled:
            continue
        gis = existing_instances(gpu)
        incomplete = [gi for gi in gis if len(gi.ci_ids) != 1]
        for gi in incomplete:
            problems.append(
                f"GPU {gpu.index}: GI {gi.gi_id} ({gi.profile} at {gi.placement}) has"
                f" {len(gi.ci_ids)} compute instances, wanted 1"
            )
        have: dict[str, int] = {}
        for gi in gis:
            have[gi.profile] = have.get(gi.profile, 0) + 1
        wanted = want.named_counts(gpu)
        if dict(sorted(have.items())) != dict(sorted(wanted.items())):
            problems.append(
                f"GPU {gpu.index}: has {describe(dict(sorted(have.items())))},"
                f" wanted {describe(wanted)}"
            )
    return problems
