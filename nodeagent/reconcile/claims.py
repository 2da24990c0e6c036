"""A DRA claim's change of the GPUs, as the engine plans and records it (the pipeline's
`run_change`, nodeagent.reconcile.pipeline). Pure, but for the record's writes in
`Changer` (nodeagent.reconcile.change), which this module's functions are handed to.

A claim's change is a value (`ClaimChange`): the claim as it will be recorded (its devices as
nodeagent.dra.prepared made them from its allocation), whether it is let go, its deadline, and
the ownership record as read when the change began (nodeagent.state.owners, the one authority
of who holds what), which travels with the run. From them the engine decides alone:

- **Owners.** A device another claim holds (`owner_of`, by GPU and memory slices) refuses the
  claim, as a whole GPU does while the record is uncertain; a share device
  (nodeagent.dra.capacity) that other claims hold already is joined, not taken: their
  processes run there.
- **Prepare.** A MIG partition device is exactly one profile at one placement. Prepared, the
  GPU should hold every slice it holds now, minus the idle ones in the way (those overlapping
  the placement, and the fewest others the hardware's other rules need gone: one `+me` profile
  per GPU, the compute slices), plus that slice: the wanted layout, exactly (every instance
  pinned), so the planner makes just that. A slice with processes, one a pod holds or one
  another claim holds in the way refuses the claim, with nothing changed. A whole GPU wants MIG
  off (the planner refuses when a slice is in use). A device with admin access wants nothing.
- **Release.** The GPU should hold what it holds minus the slices the claim created; a shared
  slice goes only with the last claim sharing it.
- **Record.** Under the MIG writer lock, before the first NVML operation, the claim and what
  it will create go into the record (`preparing`, checked once more against the record as it
  is then); after a release's operations, the claim holds nothing (`unpreparing`, until the
  driver has removed its files).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import combinations
from typing import Protocol

from nodeagent.base.errors import ConfigError, SliceInUse
from nodeagent.mig.apply import Done
from nodeagent.mig.compute import Shape
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.mig.select import MigTarget
from nodeagent.nvml.inventory import Gpu, Inventory, Slice
from nodeagent.state.held import UNPREPARING, PreparedClaim, PreparedDevice
from nodeagent.state.record import Owners, holder


@dataclass(frozen=True)
class ClaimChange:
    """One claim's change of the GPUs. `claim`: to prepare, the claim as it will be recorded
    (`preparing`, with the devices it wants); to `release`, the claim as recorded (what it
    made goes). `deadline` (time.monotonic) bounds the wait for the MIG writer lock and the
    record's lock. `read`: the ownership record as the driver read it when the change began,
    which travels with the run (None: the engine reads it then)."""

    uid: str
    claim: PreparedClaim
    release: bool = False
    deadline: float | None = None
    read: Owners | None = field(default=None, repr=False, compare=False)

    @cached_property
    def name(self) -> str:
        """Who asks, in logs and errors, as the record names the claim as a holder (so the
        claim's own devices never count as busy for its change)."""
        return str(holder(self.uid, self.claim))


@dataclass(frozen=True)
class ChangeDone:
    """What the change did: each NVML operation (with the time it took), the GPUs after it,
    how long it waited for the MIG writer lock, and the claim as the change planned it (a
    prepare's as it recorded it, its devices' `existed` decided under the lock: `settled`; a
    release's as the record had it before it was let go)."""

    operations: tuple[Done, ...]
    inventory: Inventory
    lock_wait_seconds: float = 0.0
    claim: PreparedClaim | None = None


class ClaimEngine(Protocol):
    """What runs a claim's change (the reconcile pipeline)."""

    def run_change(self, change: ClaimChange) -> ChangeDone: ...


def claim_wants(
    change: ClaimChange, owners: Owners, inventory: Inventory, held: Mapping[str, str]
) -> dict[int, MigTarget]:
    """What each GPU the change touches should be. `held`: {UUID: who} of every holder but
    the claim itself. Raises SliceInUse (another claim, a process or a pod holds what the
    claim needs), ConfigError (admin access to a slice that is not there)."""
    devices = change.claim.devices
    if change.release:
        kept = {  # a shared slice stays while another claim shares it
            d.device for d in devices if d.shared and owners.sharing(d, but=change.uid)
        }
        return release_wants(inventory, devices, change.name, kept)
    mates, joined = check_owners(change, owners, inventory)
    held = {uuid: who for uuid, who in held.items() if who not in mates}
    return prepare_wants(inventory, list(devices), held, change.name, joined)


def settled(change: ClaimChange, owners: Owners, inventory: Inventory) -> ClaimChange:
    """The claim to prepare with each MIG device's `existed` (whether its release leaves the
    slice) decided from the GPUs as the run read them under the MIG writer lock and the record
    as it is then, never from an earlier read: a share of a slice other claims hold already
    takes theirs (the slice goes with the last claim sharing it, whoever made it); admin access
    made nothing; else whether the slice is there now, where a claim recorded before with the
    device (a retry after a crash, a claim made before its pod bound) keeps its first answer
    that it made the slice while the slice is the one it recorded (one with another MIG UUID
    was made by someone else since: found; a claim recorded `preparing`, before it knew the
    MIG UUID, keeps its answer). Only the record's claims with a state count (one known from
    the DRA checkpoint's traces alone says nothing of what it made), and only the same
    driver's: a claim the record has as another driver's is refused (ConfigError).

    A release lets go of what the record says the claim holds: nothing where the record has no
    such claim, or knows it from traces only (the engine records a claim before its first NVML
    operation: a claim it has not recorded made nothing, whatever the caller's copy says)."""
    recorded = owners.claims.get(change.uid)
    if recorded is not None and recorded.state is not None:
        if recorded.driver != change.claim.driver:
            if not change.release:
                raise ConfigError(
                    f"{change.name}: the ownership record has the claim as prepared by DRA"
                    f" driver {recorded.driver!r}; one claim served by two nodeagent drivers on"
                    " one node is not supported (the record keeps one entry a claim); nothing"
                    " was changed"
                )
            recorded = None  # another driver's: nothing of it is this release's
    else:
        recorded = None  # none, or rebuilt from traces: what it made is not known
    if change.release:
        return replace(change, claim=recorded or replace(change.claim, devices=()))
    gpus = {g.index: g for g in inventory.gpus}
    before = {d.device: d for d in recorded.devices} if recorded is not None else {}
    others = [
        d
        for uid, c in sorted(owners.claims.items())
        if uid != change.uid and c.state is not None and c.driver == change.claim.driver
        for d in c.devices
        if not d.admin  # admin access made nothing and keeps nothing
    ]
    out = []
    for d in change.claim.devices:
        if not d.is_mig:
            out.append(d)
            continue
        gpu = gpus.get(d.gpu)
        there = slice_at(gpu, d.profile_id or 0, d.placement_start or 0) if gpu else None
        mates = [m for m in others if d.same_share(m)]
        if d.admin:
            existed = True
        elif mates:
            existed = mates[0].existed or _another(mates[0], there)
        else:
            prior = before.get(d.device)
            existed = there is not None and (
                prior is None or prior.existed or _another(prior, there)
            )
        out.append(replace(d, existed=existed))
    return replace(change, claim=replace(change.claim, devices=tuple(out)))


def _another(recorded: PreparedDevice, there: Slice | None) -> bool:
    """Whether the slice there now is another than the one the record has for the device (its
    own was lost, and someone made this one since: found, not made). A device recorded before
    its slice was made (`preparing`) has no MIG UUID: the record's answer stands."""
    return (
        there is not None and recorded.mig_uuid is not None and recorded.mig_uuid != there.mig_uuid
    )


def check_owners(
    change: ClaimChange, owners: Owners, inventory: Inventory
) -> tuple[set[str], set[str]]:
    """The claims sharing a device with this one (by name) and the share devices they hold
    already. Raises SliceInUse when another claim holds a device the claim wants (or the
    record is uncertain and it wants a whole GPU)."""
    gpus = {g.index: g for g in inventory.gpus}
    mates: set[str] = set()
    joined: set[str] = set()
    for d in change.claim.devices:
        if d.admin:
            continue
        gpu = _gpu(gpus, d)
        start, size = (
            (d.placement_start or 0, d.placement_size or 0)
            if d.is_mig
            else (0, gpu.memory_slice_count)
        )
        share = d if d.shared else None
        if share is not None and (sharing := owners.sharing(share, but=change.uid)):
            mates.update(sharing)
            joined.add(d.device)
        other = owners.owner_of(gpu.uuid, start, size, but=change.uid, share=share)
        if other is None and owners.uncertain is not None and not d.is_mig:
            other = f"an unknown owner ({owners.uncertain})"
        if other is not None:
            where = f"memory slices {start}-{start + size - 1}" if d.is_mig else "the GPU"
            raise SliceInUse(f"{d.device}: {other} holds {where} of GPU {d.gpu}")
    return mates, joined


def preparing(change: ClaimChange, owners: Owners) -> Owners:
    """The record with the claim in it as `change` prepares it (once planned against
    `owners`, the record as it is now)."""
    return owners.with_claim(change.uid, change.claim)


def released(uid: str, owners: Owners, driver: str) -> Owners:
    """The record once the claim's slices are gone: the claim `unpreparing`, holding nothing,
    until its files are removed too (a claim known from traces only goes at once); an entry of
    another driver than the releasing one is left as it is."""
    claim = owners.claims.get(uid)
    if claim is None:
        return owners
    if claim.state is None:
        return owners.without(uid)
    if claim.driver != driver:
        return owners
    return owners.with_claim(uid, replace(claim, state=UNPREPARING, devices=()))


def _gpu(gpus: Mapping[int, Gpu], d: PreparedDevice) -> Gpu:
    """The GPU a device is on, as read now. Raises ConfigError when NVML no longer has it (the
    driver named it from the GPUs as first read)."""
    gpu = gpus.get(d.gpu)
    if gpu is None:
        raise ConfigError(f"{d.device}: GPU {d.gpu} is not on this node now; nothing was changed")
    return gpu


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
        gpu = _gpu(gpus, d)
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
