"""What a claim wants of the GPUs, for the pipeline to plan and apply (nodeagent.mig.wanted).
Pure.

A MIG partition device is exactly one profile at one placement. Prepared, the GPU should hold
every slice it holds now, minus the idle ones in the way (those overlapping the placement, and
the fewest others the hardware's other rules need gone: one `+me` profile per GPU, the compute
slices), plus that slice: the wanted layout, exactly (every instance pinned), so the planner
makes just that. A slice with processes, one a pod holds or one another claim holds in the way
refuses the claim here, with nothing changed. A whole GPU wants MIG off (the planner refuses
when a slice is in use). Unprepared, the GPU should hold what it holds minus the slices the
claim created. A device with admin access wants nothing.

An MPS share device (nodeagent.dra.shares) wants what its twin wants; the claims already
sharing it (`joined`) are not in its way: their processes run there, and their slice is the
one this claim shares. Unprepared, a shared slice goes only with the last claim sharing it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from itertools import combinations

from nodeagent.base.errors import ConfigError, SliceInUse
from nodeagent.dra.claims import ClaimedDevice
from nodeagent.mig.compute import Shape
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.mig.select import MigTarget
from nodeagent.nvml.inventory import Gpu, Inventory, Slice
from nodeagent.state.held import PreparedDevice


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
            _fits(c, gpu.memory_total_bytes, f"GPU {gpu.index}")
            out.append(
                PreparedDevice(
                    c.request, c.pool, c.device, gpu.index, gpu.uuid, mps=mps, admin=c.admin,
                    shared=c.ref.shared, share_id=c.share_id,
                )
            )  # fmt: skip
            continue
        profile = gpu.profile_by_id(c.ref.profile_id or 0)
        at = (
            next((p for p in profile.placements if p.start == c.ref.start), None)
            if profile
            else None
        )
        if profile is None or at is None:
            raise ConfigError(f"device {c.device}: GPU {gpu.index} has no such profile placement")
        _fits(c, profile.memory_bytes, f"a {profile.name} slice")
        # A retry keeps the first answer, unless the slice is gone since (a reboot): then
        # this claim makes it.
        existed = slice_at(gpu, profile.id, at.start) is not None or c.admin
        if c.device in before and not c.admin:
            existed = existed and before[c.device].existed
        out.append(
            PreparedDevice(
                c.request, c.pool, c.device, gpu.index, gpu.uuid, profile.id, profile.name,
                at.start, at.size, existed, mps=mps, admin=c.admin, shared=c.ref.shared,
                share_id=c.share_id,
            )
        )  # fmt: skip
    return out


def _fits(c: ClaimedDevice, memory_bytes: int, what: str) -> None:
    """A share's memory is at most its device's (the scheduler hands out no more than the
    share device's capacity). Raises ConfigError."""
    pinned = c.mps.pinned_memory_bytes if c.mps is not None and c.ref.shared else None
    if pinned is not None and pinned > memory_bytes:
        raise ConfigError(
            f"device {c.device}: its share's memory ({pinned >> 20} MiB) is more than {what}"
            f" has ({memory_bytes >> 20} MiB); the scheduler hands out no more than the device's"
            " memory capacity"
        )


def slice_at(gpu: Gpu, profile_id: int, start: int) -> Slice | None:
    """The slice of that profile at that placement, if the GPU has it."""
    return next(
        (s for s in gpu.slices if s.profile_id == profile_id and s.placement.start == start), None
    )


def _gis(gpu: Gpu) -> dict[Instance, list[Slice]]:
    """The GPU's GPU instances, each with its slices (one per CI, or one without a CI)."""
    out: dict[Instance, list[Slice]] = {}
    for s in gpu.slices:
        inst = Instance(s.placement.start, s.placement.size, s.profile_id)
        out.setdefault(inst, []).append(s)
    return out


def _who(slices: list[Slice], held: Mapping[str, str]) -> str | None:
    for s in slices:
        if s.processes:
            return f"process {s.processes[0].pid}"
        if s.mig_uuid and s.mig_uuid in held:
            return held[s.mig_uuid]
    return None


def _shape(gpu: Gpu, slices: list[Slice]) -> Shape:
    """The compute-instance shape a GI has now (a GI without a CI gets a full one)."""
    g = slices[0].gi_slice_count
    sizes = [s.ci_slice_count or g for s in slices if s.ci_id is not None]
    return tuple(sorted(sizes, reverse=True)) or (g,)


def _desired(gpu: Gpu, layout: dict[Instance, Shape], source: str) -> MigTarget:
    counts: dict[int, int] = {}
    shapes: dict[int, list[Shape]] = {}
    for inst, shape in sorted(layout.items()):
        counts[inst.profile_id] = counts.get(inst.profile_id, 0) + 1
        shapes.setdefault(inst.profile_id, []).append(shape)
    return MigTarget(
        gpu.index,
        True,
        counts,
        source,
        {pid: tuple(sorted(s, reverse=True)) for pid, s in shapes.items()},
        tuple(sorted(layout)),
    )


def _make_room(
    gpu: Gpu, layout: dict[Instance, Shape], busy: dict[Instance, str], want: Instance
) -> None:
    """Drop from `layout` the GIs overlapping `want` and the fewest idle others the hardware's
    rules need gone. Raises SliceInUse naming a busy one in the way."""
    geometry = Geometry.of(gpu)
    name = geometry.profile(want.profile_id).name
    for inst in [i for i in layout if i.slots & want.slots]:
        if inst in busy:
            other = geometry.profile(inst.profile_id).name
            raise SliceInUse(
                f"GPU {gpu.index} slice {other} at placement {inst.placement} is in use"
                f" ({busy[inst]}); nothing was changed"
            )
        del layout[inst]
    free = [i for i in layout if i not in busy]
    for k in range(len(free) + 1):
        for extra in combinations(free, k):
            if geometry.fits([i for i in layout if i not in extra], want):
                for i in extra:
                    del layout[i]
                return
    blocking = ", ".join(
        f"{geometry.profile(i.profile_id).name} ({busy[i]})" for i in layout if i in busy
    )
    raise SliceInUse(
        f"GPU {gpu.index}: {name} at placement {want.placement} does not fit beside the slices"
        f" in use: {blocking}; nothing was changed"
    )


def prepare_wants(
    inventory: Inventory,
    devices: list[PreparedDevice],
    held: Mapping[str, str],
    source: str,
    joined: Collection[str] = (),
) -> dict[int, MigTarget]:
    """What the GPUs of `devices` should be for the claim to hold them. `held`: {UUID: who}
    of every holder but the claim itself (and the claims it shares a device with); `joined`:
    the share devices other claims hold already. Raises SliceInUse."""
    gpus = {g.index: g for g in inventory.gpus}
    layouts: dict[int, dict[Instance, Shape]] = {}
    out: dict[int, MigTarget] = {}
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
        gis = _gis(gpu) if gpu.mig_current else {}
        busy = {i: who for i, ss in gis.items() if (who := _who(ss, held)) is not None}
        if not d.is_mig:
            if (who := held.get(gpu.uuid)) is not None or (
                d.device not in joined
                and gpu.processes
                and (who := f"process {gpu.processes[0].pid}")
            ):
                raise SliceInUse(f"GPU {gpu.index} is in use ({who}); nothing was changed")
            if gpu.mig_current or gpu.mig_pending:
                out[gpu.index] = MigTarget(gpu.index, False, {}, source)
            continue
        if (who := held.get(gpu.uuid)) is not None:
            raise SliceInUse(f"GPU {gpu.index} is in use ({who}); nothing was changed")
        assert d.profile_id is not None and d.placement_start is not None
        assert d.placement_size is not None
        want = Instance(d.placement_start, d.placement_size, d.profile_id)
        layout = layouts.setdefault(gpu.index, {i: _shape(gpu, ss) for i, ss in gis.items()})
        profile = gpu.profile_by_id(d.profile_id)
        assert profile is not None
        full: Shape = (profile.slice_count,)
        if d.device in joined:  # the processes there are the other shares' clients
            busy.pop(want, None)
        if want in layout and layout[want] != full and want in busy:
            raise SliceInUse(
                f"GPU {gpu.index} slice {profile.name} at placement {want.placement} is in use"
                f" ({busy[want]}); nothing was changed"
            )
        if want in busy:
            raise SliceInUse(
                f"GPU {gpu.index} slice {profile.name} at placement {want.placement} is in use"
                f" ({busy[want]})"
            )
        if want not in layout:
            _make_room(gpu, layout, busy, want)
        layout[want] = full
        out[gpu.index] = _desired(gpu, layout, source)
    return out


def release_wants(
    inventory: Inventory,
    devices: tuple[PreparedDevice, ...],
    source: str,
    kept: Collection[str] = (),
) -> dict[int, MigTarget]:
    """What the GPUs should be once the slices the claim created (not those that were there
    before it, nor the shared ones in `kept` that other claims still hold) are gone."""
    gpus = {g.index: g for g in inventory.gpus}
    layouts: dict[int, dict[Instance, Shape]] = {}
    for d in devices:
        gpu = gpus.get(d.gpu)
        if gpu is None or not d.is_mig or d.existed or d.admin or not gpu.mig_current:
            continue
        if d.device in kept:
            continue
        assert d.profile_id is not None and d.placement_start is not None
        assert d.placement_size is not None
        gis = _gis(gpu)
        layout = layouts.setdefault(gpu.index, {i: _shape(gpu, ss) for i, ss in gis.items()})
        layout.pop(Instance(d.placement_start, d.placement_size, d.profile_id), None)
    return {
        i: _desired(gpus[i], layout, source)
        for i, layout in layouts.items()
        if set(layout) != set(_gis(gpus[i]))
    }


def release_slices(devices: tuple[PreparedDevice, ...]) -> list[PreparedDevice]:
    """The devices whose slices the claim made (unprepare destroys them)."""
    return [replace(d) for d in devices if d.is_mig and not d.existed and not d.admin]
