"""The minimal transition plan from the current slices to the desired counts. Pure.

For each GPU the target layout is chosen among every valid layout with the desired counts
that keeps all in-use slices, minimising NVML mutations (destroying a slice costs one call per
CI plus one for its GI; creating costs one for the GI and one per CI; a kept GI whose compute
instances differ from the wanted ones keeps the CIs it can and changes only the others).
Operations are ordered: set MIG mode (enable), destroy CIs, destroy GIs, set MIG mode
(disable), create GIs at explicit placements, create their CIs at explicit placements.
A GPU whose MIG devices already are the wanted ones (by profile and count, as mig-parted
compares them) gets no operation, however its compute instances are grouped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache
from itertools import product
from typing import Any

from nodeagent.base.errors import GeometryInvalid, SliceInUse
from nodeagent.mig import compute
from nodeagent.mig.compute import CiPlacement, Shape
from nodeagent.mig.geometry import Geometry, Instance, Layout
from nodeagent.mig.select import MigTarget, describe
from nodeagent.nvml.inventory import Gpu, Inventory, Placement, Slice


class Op(str, Enum):
    """The NVML operations a plan is made of (their names in JSON output and logs)."""

    SET_MIG_MODE = "set-mig-mode"
    DESTROY_CI = "destroy-ci"
    DESTROY_GI = "destroy-gi"
    CREATE_GI = "create-gi"
    CREATE_CI = "create-ci"

    @property
    def destroys(self) -> bool:
        return self in (Op.DESTROY_CI, Op.DESTROY_GI)


@dataclass(frozen=True)
class Operation:
    op: Op
    gpu: int
    profile: str | None = None
    profile_id: int | None = None
    placement: Placement | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    enabled: bool | None = None
    slice_count: int | None = None  # create-ci: the CI's compute slices
    ci_start: int | None = None  # create-ci: where it starts inside the GI

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op.value, "gpu": self.gpu}
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
        if self.op is Op.CREATE_CI and self.slice_count is not None:
            out["compute_slices"] = self.slice_count
            out["ci_start"] = self.ci_start or 0
        return out


@dataclass(frozen=True)
class GpuPlan:
    gpu: int
    operations: tuple[Operation, ...]
    target: Layout = ()
    kept: tuple[int, ...] = ()  # GI ids kept as they are


@dataclass(frozen=True)
class Plan:
    gpus: tuple[GpuPlan, ...] = field(default_factory=tuple)
    # every GPU's operations in order, once: each step asks for them
    operations: tuple[Operation, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        operations = tuple(op for g in self.gpus for op in g.operations)
        object.__setattr__(self, "operations", operations)

    @property
    def mutations(self) -> int:
        return len(self.operations)

    def to_dict(self) -> dict[str, Any]:
        return {"operations": [op.to_dict() for op in self.operations]}


NO_PLAN = Plan()  # no GPU, no operation: a run's plan until it plans (frozen, shared)


@dataclass(frozen=True)
class _Gi:
    """One existing GPU instance and its compute instances (from the Inventory's slices)."""

    gi_id: int
    profile_id: int
    profile: str
    placement: Placement
    slices: tuple[Slice, ...]
    holders: tuple[str, ...]  # who uses it: "pid 1234", "pod ns/name"
    slice_count: int = 0  # the GI's compute slices
    cis: tuple[tuple[int, CiPlacement], ...] = ()  # (ci id, (start, size)) of each CI
    busy_cis: tuple[CiPlacement, ...] = ()  # the CIs in use

    @property
    def ci_ids(self) -> tuple[int, ...]:
        return tuple(ci for ci, _ in self.cis)

    @property
    def shape(self) -> Shape:
        return tuple(sorted((size for _, (_, size) in self.cis), reverse=True))

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
        cis: list[tuple[int, CiPlacement]] = []
        busy: list[CiPlacement] = []
        g = first.gi_slice_count
        for s in slices:
            mine = [f"pid {p.pid}" for p in s.processes]
            if s.mig_uuid and s.mig_uuid in in_use:
                mine.append(in_use[s.mig_uuid])
            holders += mine
            if s.ci_id is not None:
                where = (s.ci_start, s.ci_slice_count or g)
                cis.append((s.ci_id, where))
                if mine:
                    busy.append(where)
        gis.append(
            _Gi(
                gi_id=gi_id,
                profile_id=first.profile_id,
                profile=first.profile,
                placement=first.placement,
                slices=tuple(slices),
                holders=tuple(holders),
                slice_count=g,
                cis=tuple(cis),
                busy_cis=tuple(busy),
            )
        )
    return gis


@dataclass(frozen=True)
class _Target:
    """A layout with the CI shape each of its GIs gets, and what reaching it costs."""

    layout: Layout
    shapes: dict[Instance, Shape]
    keep_cis: dict[Instance, tuple[CiPlacement, ...]]  # kept GIs: the CIs that stay
    cost: int


def _reshape(gi: _Gi, shape: Shape) -> tuple[int, tuple[CiPlacement, ...]] | None:
    """The cost of giving an existing GI the CIs of `shape`, and the CIs it keeps; None when
    a CI in use cannot stay."""
    have = [where for _, where in gi.cis]
    kept = compute.keepable(gi.slice_count, shape, have, gi.busy_cis)
    if kept is None:
        return None
    return (len(have) - len(kept)) + (len(shape) - len(kept)), kept


def _best_shapes(
    kept: list[_Gi], shapes: tuple[Shape, ...]
) -> tuple[int, tuple[tuple[Shape, tuple[CiPlacement, ...]], ...]] | None:
    """The cheapest one-to-one choice of wanted shapes for the kept GIs of one profile (the
    shapes left over go to new GIs): exact, over every assignment (a profile has at most a few
    GIs); None when some GI cannot keep its busy compute instances under any choice."""

    @cache
    def go(i: int, left: tuple[Shape, ...]) -> tuple[int, tuple[Any, ...]] | None:
        if i == len(kept):
            return sum(1 + len(s) for s in left), ()
        best: tuple[int, tuple[Any, ...]] | None = None
        for shape in sorted(set(left)):
            step = _reshape(kept[i], shape)
            if step is None:
                continue
            rest = list(left)
            rest.remove(shape)
            tail = go(i + 1, tuple(rest))
            if tail is not None and (best is None or step[0] + tail[0] < best[0]):
                best = (step[0] + tail[0], ((shape, step[1]), *tail[1]))
        return best

    return go(0, tuple(sorted(shapes, reverse=True)))


def _assign(
    geometry: Geometry, layout: Layout, want: MigTarget, existing: dict[Instance, _Gi]
) -> _Target | None:
    """Give each GI of `layout` one of the wanted shapes of its profile at the least cost;
    None when an in-use GI cannot keep its busy compute instances."""
    shapes: dict[Instance, Shape] = {}
    keep: dict[Instance, tuple[CiPlacement, ...]] = {}
    cost = sum(gi.destroy_cost for inst, gi in existing.items() if inst not in layout)
    for pid in sorted({inst.profile_id for inst in layout}):
        wanted = want.shapes_of(geometry.profile(pid))
        insts = [i for i in layout if i.profile_id == pid]
        kept = [i for i in insts if i in existing]
        best = _best_shapes([existing[i] for i in kept], wanted)
        if best is None:
            return None
        step, chosen = best
        cost += step
        left = list(wanted)
        for inst, (shape, kept_cis) in zip(kept, chosen, strict=True):
            shapes[inst], keep[inst] = shape, kept_cis
            left.remove(shape)
        for inst in insts:
            if inst not in shapes:
                shapes[inst] = left.pop(0)
    return _Target(layout, shapes, keep, cost)


MAX_REGROUPINGS = 256


def _regroupings(geometry: Geometry, want: MigTarget) -> list[MigTarget]:
    """`want` with its compute instances grouped into GIs in every other way that fits (at
    most MAX_REGROUPINGS of them)."""
    options: list[list[tuple[int, tuple[Shape, ...]]]] = []
    for pid, wanted in sorted(want.shapes.items()):
        p = geometry.profile(pid)
        full = compute.full(p.slice_count)
        fulls = tuple(s for s in wanted if s == full)
        sizes = [c for s in wanted if s != full for c in s]
        groups = compute.partitions(p.slice_count, sizes, p.instance_count - len(fulls))
        options.append([(pid, tuple(sorted(fulls + g, reverse=True))) for g in groups])
    out: list[MigTarget] = []
    for combo in product(*options):
        if len(out) >= MAX_REGROUPINGS:
            break
        shapes = dict(want.shapes) | dict(combo)
        if shapes == want.shapes:
            continue
        counts = dict(want.counts) | {pid: len(s) for pid, s in combo}
        if geometry.fits_counts(counts):
            out.append(replace(want, counts=counts, shapes=shapes))
    return out


def choose_target(geometry: Geometry, want: MigTarget, existing: list[_Gi]) -> _Target | None:
    """The cheapest valid layout with the wanted counts and shapes keeping every in-use GI
    (and its busy compute instances); None if there is none."""
    by_inst = {gi.instance: gi for gi in existing}
    required = sorted({gi.instance for gi in existing if gi.in_use} | set(want.pinned))
    best: _Target | None = None
    for layout in geometry.layouts(want.counts, required):
        target = _assign(geometry, layout, want, by_inst)
        if target is not None and (best is None or target.cost < best.cost):
            best = target
            if target.cost == 0:
                break
    return best


def device_counts(gpu: Gpu) -> dict[str, int]:
    """The GPU's MIG devices by profile name ('1g.18gb', '1c.3g.71gb'), as mig-parted
    counts them; GIs without a compute instance are not devices."""
    out: dict[str, int] = {}
    for s in gpu.slices:
        if s.ci_id is not None:
            out[s.device_profile] = out.get(s.device_profile, 0) + 1
    return dict(sorted(out.items()))


def _blockers(
    geometry: Geometry, counts: Mapping[int, int], existing: list[_Gi], pinned: tuple[Instance, ...]
) -> list[_Gi]:
    """The in-use GIs that stand in the way: those left out of the layout keeping the most."""
    busy = [gi for gi in existing if gi.in_use]
    best: set[Instance] = set()
    for layout in geometry.layouts(counts, pinned):
        kept = {gi.instance for gi in busy} & set(layout)
        if len(kept) > len(best):
            best = kept
    return [gi for gi in busy if gi.instance not in best]


def _destroy(gpu: int, gis: list[_Gi]) -> list[Operation]:
    """Destroy every CI of these GIs, then the GIs (NVML refuses a GI that still has CIs)."""
    ops = [
        Operation(Op.DESTROY_CI, gpu, gi.profile, gi.profile_id, gi.placement, gi.gi_id, ci)
        for gi in gis
        for ci in gi.ci_ids
    ]
    ops += [
        Operation(Op.DESTROY_GI, gpu, gi.profile, gi.profile_id, gi.placement, gi.gi_id)
        for gi in gis
    ]
    return ops


def plan_gpu(gpu: Gpu, want: MigTarget, in_use: Mapping[str, str] | None = None) -> GpuPlan:
    """The operations that bring one GPU to `want`. Raises SliceInUse or GeometryInvalid."""
    existing = existing_instances(gpu, in_use) if gpu.mig_current else []
    whole = (in_use or {}).get(gpu.uuid)  # a pod or a DRA claim holding the whole GPU
    if whole is not None and (gpu.mig_current, gpu.mig_pending) != (want.mig_enabled,) * 2:
        raise SliceInUse(
            f"cannot {'enable' if want.mig_enabled else 'disable'} MIG on GPU {gpu.index}:"
            f" the whole GPU is in use by {whole}; nothing was changed"
        )
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
            ops.append(Operation(Op.SET_MIG_MODE, gpu.index, enabled=False))
        return GpuPlan(gpu.index, tuple(ops))
    ops = []
    if not (gpu.mig_current and gpu.mig_pending):
        ops.append(Operation(Op.SET_MIG_MODE, gpu.index, enabled=True))
    complete = all(gi.cis for gi in existing)
    pinned_there = set(want.pinned) <= {gi.instance for gi in existing}
    if complete and pinned_there and not ops and device_counts(gpu) == want.named_counts(gpu):
        return GpuPlan(gpu.index, ())  # the wanted MIG devices, however they are grouped
    geometry = Geometry.of(gpu)
    chosen = choose_target(geometry, want, existing)
    if chosen is None and any(gi.busy_cis for gi in existing):
        # The preferred grouping of the compute instances would destroy one in use: the same
        # MIG devices grouped otherwise count as applied too (mig-parted compares devices).
        for other in _regroupings(geometry, want):
            found = choose_target(geometry, other, existing)
            if found is not None and (chosen is None or found.cost < chosen.cost):
                chosen = found
    if chosen is None:
        names = want.named_counts(gpu)
        blockers = _blockers(geometry, want.counts, existing, want.pinned)
        blockers = blockers or [gi for gi in existing if gi.busy_cis]
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
    by_inst = {gi.instance: gi for gi in existing}
    kept = [by_inst[i] for i in chosen.layout if i in by_inst]
    kept_ids = {gi.gi_id for gi in kept}
    for gi in kept:  # CIs of kept GIs that their new shape does not keep
        stay = list(chosen.keep_cis[gi.instance])
        for ci, where in gi.cis:
            if where in stay:
                stay.remove(where)
                continue
            ops.append(
                Operation(
                    Op.DESTROY_CI, gpu.index, gi.profile, gi.profile_id, gi.placement, gi.gi_id, ci
                )
            )
    ops += _destroy(gpu.index, [gi for gi in existing if gi.gi_id not in kept_ids])
    new = [inst for inst in chosen.layout if inst not in by_inst]
    profiles = {p.id: p for p in gpu.profiles}
    for inst in new:
        p = profiles[inst.profile_id]
        ops.append(Operation(Op.CREATE_GI, gpu.index, p.name, p.id, inst.placement))
    for inst in [*(gi.instance for gi in kept), *new]:
        p = profiles[inst.profile_id]
        old = by_inst.get(inst)
        kept_cis = chosen.keep_cis.get(inst, ())
        for start, size in compute.place(p.slice_count, chosen.shapes[inst], kept_cis) or ():
            ops.append(
                Operation(
                    Op.CREATE_CI,
                    gpu.index,
                    p.name,
                    p.id,
                    inst.placement,
                    old.gi_id if old is not None else None,
                    slice_count=size,
                    ci_start=start,
                )
            )
    return GpuPlan(gpu.index, tuple(ops), chosen.layout, tuple(sorted(kept_ids)))


def plan(
    inventory: Inventory, desired: Mapping[int, MigTarget], in_use: Mapping[str, str] | None = None
) -> Plan:
    """Plan every GPU in `desired`; GPUs not in it, or already matching, get no operation.

    All GPUs are planned before anything runs, so a refusal on one changes none.
    """
    plans = []
    for gpu in inventory.gpus:
        if gpu.index in desired:
            plans.append(plan_gpu(gpu, desired[gpu.index], in_use))
    return Plan(tuple(plans))


def mismatches(inventory: Inventory, desired: Mapping[int, MigTarget]) -> list[str]:
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
        for gi in existing_instances(gpu):
            if not gi.cis:
                problems.append(
                    f"GPU {gpu.index}: GI {gi.gi_id} ({gi.profile} at {gi.placement}) has no"
                    " compute instance"
                )
        have = device_counts(gpu)
        wanted = want.named_counts(gpu)
        if have != wanted:
            problems.append(f"GPU {gpu.index}: has {describe(have)}, wanted {describe(wanted)}")
        there = {gi.instance for gi in existing_instances(gpu)}
        for inst in want.pinned:
            if inst not in there:
                name = next((p.name for p in gpu.profiles if p.id == inst.profile_id), "?")
                problems.append(f"GPU {gpu.index}: no {name} slice at placement {inst.placement}")
    return problems
