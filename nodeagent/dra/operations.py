"""A claim's devices -> the fewest MIG operations that make them, never touching a busy slice.
Pure.

A MIG partition device is exactly one profile at one placement. If that slice is there (idle
and no other claim's), it is used as it is; a GI left without its CI (a crash between the two
creates) gets its CI; otherwise the idle slices overlapping the placement go, and the fewest
other idle ones the hardware's other rules need gone (one `+me` profile per GPU, the compute
slices), and the slice is created at that placement. A slice with processes, one a pod holds
(kubelet pod-resources) or one another claim holds that is in the way refuses the claim:
nothing is changed. A whole GPU needs MIG off: its
idle slices go, then MIG mode. A device with admin access changes nothing (its slice must be
there). Operations come in the order the MIG executor runs them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from itertools import combinations

from nodeagent.dra.checkpoint import Checkpoint, PreparedDevice
from nodeagent.dra.claims import ClaimedDevice
from nodeagent.errors import ConfigError, SliceInUse
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.mig.plan import GpuPlan, Operation, Plan
from nodeagent.nvml.inventory import Gpu, Inventory, Placement, Slice


def intents(
    inventory: Inventory,
    claimed: list[ClaimedDevice],
    previous: tuple[PreparedDevice, ...] = (),
    managed: Collection[int] | None = None,
) -> list[PreparedDevice]:
    """What each claimed device is on this node. `existed` says a MIG slice was already there
    before the claim; a claim prepared before (a retry after a crash) keeps its first answer.
    Raises ConfigError for a GPU, profile or placement this node does not have."""
    gpus = {g.index: g for g in inventory.gpus if managed is None or g.index in managed}
    before = {d.device: d for d in previous}
    out = []
    for c in claimed:
        gpu = gpus.get(c.ref.gpu)
        if gpu is None:
            raise ConfigError(f"device {c.device}: GPU {c.ref.gpu} is not one this driver manages")
        mps = None if c.mps is None else c.mps.to_dict()
        if not c.ref.is_mig:
            out.append(
                PreparedDevice(
                    c.request, c.pool, c.device, gpu.index, gpu.uuid, mps=mps, admin=c.admin
                )
            )
            continue
        profile = gpu.profile_by_id(c.ref.profile_id or 0)
        at = (
            next((p for p in profile.placements if p.start == c.ref.start), None)
            if profile
            else None
        )
        if profile is None or at is None:
            raise ConfigError(f"device {c.device}: GPU {gpu.index} has no such profile placement")
        # A retry keeps the first answer, unless the slice is gone since (a reboot): then
        # this claim makes it.
        existed = slice_at(gpu, profile.id, at.start) is not None or c.admin
        if c.device in before and not c.admin:
            existed = existed and before[c.device].existed
        out.append(
            PreparedDevice(
                c.request,
                c.pool,
                c.device,
                gpu.index,
                gpu.uuid,
                profile.id,
                profile.name,
                at.start,
                at.size,
                existed,
                admin=c.admin,
            )
        )
    return out


def slice_at(gpu: Gpu, profile_id: int, start: int) -> Slice | None:
    """The slice of that profile at that placement, if the GPU has it."""
    return next(
        (s for s in gpu.slices if s.profile_id == profile_id and s.placement.start == start), None
    )


def _busy(s: Slice, held: Mapping[str, str]) -> str | None:
    if s.processes:
        return f"process {s.processes[0].pid}"
    return held.get(s.mig_uuid) if s.mig_uuid else None


def destroy_ops(gpu: Gpu, slices: list[Slice], held: Mapping[str, str]) -> list[Operation]:
    """Destroy these slices (CIs, then GIs). Raises SliceInUse when one is busy."""
    ops: list[Operation] = []
    gis: dict[int, Slice] = {}
    for s in slices:
        who = _busy(s, held)
        if who is not None:
            raise SliceInUse(
                f"GPU {gpu.index} slice {s.profile} at placement {s.placement} is in use"
                f" ({who}); nothing was changed"
            )
        if s.ci_id is not None:
            ops.append(
                Operation(
                    "destroy-ci", gpu.index, s.profile, s.profile_id, s.placement, s.gi_id, s.ci_id
                )
            )
        gis.setdefault(s.gi_id, s)
    for s in gis.values():
        ops.append(
            Operation("destroy-gi", gpu.index, s.profile, s.profile_id, s.placement, s.gi_id)
        )
    return ops


@dataclass(frozen=True)
class Busy:
    """Who keeps a GPU instance (its slices) or a whole GPU as it is: a process on it, a pod
    holding it (`held`: device UUID -> pod), another claim than `uid` (the checkpoint)."""

    checkpoint: Checkpoint
    uid: str
    held: Mapping[str, str]

    def gi(self, slices: list[Slice]) -> str | None:
        for s in slices:
            if (who := _busy(s, self.held)) is not None:
                return who
        s = slices[0]
        claim = self.checkpoint.holder_of(
            s.gpu_index, s.placement.start, s.placement.size, but=self.uid
        )
        return None if claim is None else str(claim)

    def gpu(self, gpu: Gpu) -> str | None:
        return f"process {gpu.processes[0].pid}" if gpu.processes else self.held.get(gpu.uuid)


def _gis(gpu: Gpu) -> dict[int, list[Slice]]:
    """The GPU's GPU instances: GI id -> its slices (one per CI, or one without a CI)."""
    out: dict[int, list[Slice]] = {}
    for s in gpu.slices:
        out.setdefault(s.gi_id, []).append(s)
    return out


def _instance(s: Slice) -> Instance:
    return Instance(s.placement.start, s.placement.size, s.profile_id)


def _in_the_way(gpu: Gpu, gis: dict[int, list[Slice]], want: Instance, blocked: Busy) -> list[int]:
    """The GIs to destroy so that `want` fits: those overlapping it, plus the fewest idle
    others when the hardware's other rules need it (one `+me` per GPU, the compute slices).
    Raises SliceInUse naming a busy one that is in the way."""
    geometry = Geometry.of(gpu)
    overlapping = [g for g, ss in gis.items() if _instance(ss[0]).slots & want.slots]
    for g in overlapping:
        if (who := blocked.gi(gis[g])) is not None:
            s = gis[g][0]
            raise SliceInUse(
                f"GPU {gpu.index} slice {s.profile} at placement {s.placement} is in use"
                f" ({who}); nothing was changed"
            )
    rest = [g for g in gis if g not in overlapping]
    free = [g for g in rest if blocked.gi(gis[g]) is None]
    for k in range(len(free) + 1):
        for extra in combinations(free, k):
            kept = [_instance(gis[g][0]) for g in rest if g not in extra]
            if geometry.fits(kept, want):
                return overlapping + list(extra)
    busy = ", ".join(f"{gis[g][0].profile} ({blocked.gi(gis[g])})" for g in rest if g not in free)
    raise SliceInUse(
        f"GPU {gpu.index}: {geometry.profile(want.profile_id).name} at placement"
        f" {want.placement} does not fit beside the slices in use: {busy}; nothing was changed"
    )


def _mig_ops(gpu: Gpu, d: PreparedDevice, blocked: Busy) -> list[Operation]:
    profile = gpu.profile_by_id(d.profile_id or 0)
    assert profile is not None and d.placement_start is not None and d.placement_size is not None
    at = Placement(d.placement_start, d.placement_size)
    ops: list[Operation] = []
    if not gpu.mig_current:
        if (who := blocked.gpu(gpu)) is not None:
            raise SliceInUse(f"GPU {gpu.index} is in use ({who}); its MIG mode cannot change")
        ops.append(Operation("set-mig-mode", gpu.index, enabled=True))
    gis = _gis(gpu)
    want = Instance(at.start, at.size, profile.id)
    exact = next((ss for ss in gis.values() if _instance(ss[0]) == want), None)
    if exact is not None and (who := blocked.gi(exact)) is not None:
        raise SliceInUse(f"GPU {gpu.index} slice {d.profile} at placement {at} is in use ({who})")
    create_ci = Operation(
        "create-ci", gpu.index, profile.name, profile.id, at, None,
        slice_count=profile.slice_count, ci_start=0,
    )  # fmt: skip
    if exact is not None and len(exact) == 1:
        (s,) = exact
        if s.ci_id is None:  # a crash between the GI and its CI
            return [*ops, replace(create_ci, gi_id=s.gi_id)]
        if s.ci_slice_count in (None, profile.slice_count):
            return ops  # there as wanted
    # A slice there with other compute instances is made again, whole.
    doomed = _in_the_way(gpu, gis, want, blocked)
    ops += destroy_ops(gpu, [s for g in doomed for s in gis[g]], {})
    return [*ops, Operation("create-gi", gpu.index, profile.name, profile.id, at), create_ci]


def plan_claim(
    inventory: Inventory,
    uid: str,
    devices: list[PreparedDevice],
    checkpoint: Checkpoint,
    held: Mapping[str, str],
) -> Plan:
    """The operations that make `devices` for claim `uid`. Raises SliceInUse when a device
    overlaps another claim's, or a slice that processes or pods use."""
    gpus = {g.index: g for g in inventory.gpus}
    per_gpu: dict[int, list[Operation]] = {}
    for d in devices:
        gpu = gpus[d.gpu]
        if d.admin:  # the GPU as it is: a slice with admin access must be there
            there = slice_at(gpu, d.profile_id or 0, d.placement_start or 0) if d.is_mig else None
            if d.is_mig and (there is None or there.ci_id is None):
                raise ConfigError(
                    f"{d.device}: admin access to a MIG slice GPU {d.gpu} does not have"
                    " (admin access never changes a GPU)"
                )
            continue
        start, size = (d.placement_start or 0, d.placement_size or gpu.memory_slice_count)
        other = checkpoint.holder_of(d.gpu, start, size, but=uid)
        if other is not None:
            where = f"memory slices {start}-{start + size - 1}" if d.is_mig else "the GPU"
            raise SliceInUse(f"{d.device}: {other} holds {where} of GPU {d.gpu}")
        ops = per_gpu.setdefault(d.gpu, [])
        blocked = Busy(checkpoint, uid, held)
        if d.is_mig:
            ops += _mig_ops(_after(gpu, ops), d, blocked)
        elif gpu.mig_current:
            ops += destroy_ops(gpu, list(gpu.slices), held)
            ops.append(Operation("set-mig-mode", gpu.index, enabled=False))
        elif (who := held.get(gpu.uuid)) is not None:
            raise SliceInUse(f"GPU {gpu.index} is in use ({who})")
    return Plan(
        tuple(GpuPlan(g, tuple(_ordered(ops))) for g, ops in sorted(per_gpu.items()) if ops)
    )


def _after(gpu: Gpu, ops: list[Operation]) -> Gpu:
    """The GPU as the earlier operations of this claim leave it (MIG mode; slices they
    destroy are gone), for the next device's planning."""
    gone = {op.gi_id for op in ops if op.op == "destroy-gi"}
    enabled = gpu.mig_current or any(op.op == "set-mig-mode" and op.enabled for op in ops)
    return replace(
        gpu, mig_current=enabled, slices=tuple(s for s in gpu.slices if s.gi_id not in gone)
    )


def _rank(op: Operation) -> int:
    """MIG on, destroy CIs, destroy GIs, MIG off, create GIs, create CIs (mig.plan's order)."""
    if op.op == "set-mig-mode":
        return 0 if op.enabled else 3
    return {"destroy-ci": 1, "destroy-gi": 2, "create-gi": 4, "create-ci": 5}[op.op]


def _ordered(ops: list[Operation]) -> list[Operation]:
    return sorted(ops, key=_rank)  # stable: each kind keeps its order
