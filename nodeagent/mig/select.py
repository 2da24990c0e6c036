"""Resolve one named config of a file against the node's GPUs: what each GPU should become.

Checks everything that needs the node (device indices, profiles the model lacks, counts over
capacity, combinations with no valid placement) and reports all problems at once. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeagent.base.configfile import config_error
from nodeagent.base.errors import ConfigError, NothingMatched
from nodeagent.base.logs import get_logger, listing
from nodeagent.mig import compute
from nodeagent.mig.compute import Shape
from nodeagent.mig.config import Entry, MigConfigFile, ProfileCount
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.mig.profile import profile_or_none
from nodeagent.nvml.inventory import GiProfile, Gpu, Inventory

log = get_logger("nodeagent.mig")


@dataclass(frozen=True)
class MigTarget:
    """What one GPU should be: MIG mode, GPU instances by NVML profile id, and for each
    profile the compute-instance shape of each of its GIs (absent: one full CI per GI)."""

    gpu: int
    mig_enabled: bool
    counts: dict[int, int]
    source: str  # "file:line:col" of the config entry, for messages
    shapes: dict[int, tuple[Shape, ...]] = field(default_factory=dict)
    # GPU instances the layout must hold (a DRA claim's slice at its placement; with every
    # instance of a layout pinned, that layout exactly). Empty: any placement of the counts.
    pinned: tuple[Instance, ...] = ()

    def shapes_of(self, profile: GiProfile) -> tuple[Shape, ...]:
        """One CI shape per wanted GI of `profile`, largest first."""
        n = self.counts.get(profile.id, 0)
        return self.shapes.get(profile.id, (compute.full(profile.slice_count),) * n)

    def named_counts(self, gpu: Gpu) -> dict[str, int]:
        """MIG devices by profile name as NVIDIA writes them ('1c.3g.40gb' for a CI)."""
        out: dict[str, int] = {}
        for p in gpu.profiles:
            for shape in self.shapes_of(p):
                for c in shape:
                    name = p.name if c == p.slice_count else f"{c}c.{p.name}"
                    out[name] = out.get(name, 0) + 1
        return dict(sorted(out.items()))


def find_profile(gpu: Gpu, name: str) -> GiProfile | None:
    """The GPU's GI profile that a config's profile name means ('1c.3g.40gb' -> 3g.40gb;
    attributes in any order)."""
    wanted = profile_or_none(name)
    if wanted is None:
        return None
    for p in gpu.profiles:
        have = profile_or_none(p.name)
        if have is not None and have.same_gi(wanted):
            return p
    return None


def describe(counts: dict[str, int]) -> str:
    return " + ".join(f"{n}x{name}" for name, n in counts.items()) or "no slices"


def _gpu_label(gpus: list[Gpu]) -> str:
    indices = ", ".join(str(g.index) for g in gpus)
    return f"GPU{'s' if len(gpus) > 1 else ''} {indices} ({gpus[0].name})"


def resolve(
    cfg: MigConfigFile, name: str, inventory: Inventory, notes: list[str] | None = None
) -> dict[int, MigTarget]:
    """The desired state of every GPU the config `name` covers; GPUs it does not cover are
    left out (and left alone). As mig-parted does, an index beyond the node's GPUs is skipped
    (a config written for 8 GPUs works on 4) and `devices: all` skips GPUs without MIG; each
    skip is said in `notes` (logged as a warning when no list is given). Raises ConfigError
    (all problems) or NothingMatched."""
    if notes is None:
        notes = []
        found = resolve(cfg, name, inventory, notes)
        for note in notes:
            log.warning("mig.config.skipped", reason=note)
        return found
    if name not in cfg.configs:
        known = listing(sorted(cfg.configs))
        raise ConfigError(f"{cfg.source}: no config named {name!r}; the file defines: {known}")
    gpus = inventory.gpus
    errors: list[str] = []
    desired: dict[int, MigTarget] = {}
    for entry in cfg.configs[name]:
        fresh = []
        for gpu in _matched(entry, gpus, notes):
            if entry.devices == "all" and entry.mig_enabled and not gpu.mig_capable:
                notes.append(
                    f"{entry.mark}: GPU {gpu.index} ({gpu.name}) does not support MIG;"
                    " 'devices: all' skips it"
                )
                continue
            if gpu.index in desired:
                errors.append(
                    f"{entry.mark}: GPU {gpu.index} is already configured by the entry at"
                    f" {desired[gpu.index].source}; each GPU may match one entry"
                )
            else:
                fresh.append(gpu)
        # Check once per GPU model, naming every GPU of that model the entry covers.
        by_model: dict[int, list[Gpu]] = {}
        for gpu in fresh:
            by_model.setdefault(gpu.pci_device_id, []).append(gpu)
        for same in by_model.values():
            counts = _counts(entry, same, errors)
            for gpu in same:
                if counts is not None:
                    desired[gpu.index] = MigTarget(
                        gpu.index, entry.mig_enabled, counts[0], str(entry.mark), counts[1]
                    )
                else:
                    mark = str(entry.mark)
                    desired[gpu.index] = MigTarget(gpu.index, entry.mig_enabled, {}, mark)
    if errors:
        raise config_error(cfg.source, errors)
    if not desired:
        raise NothingMatched(
            f"{cfg.source}: config {name!r} matches no GPU on this node"
            f" ({', '.join(f'{g.index}: {g.name} 0x{g.pci_device_id:08X}' for g in gpus)})"
            + "".join(f"; {note.split(': ', 1)[-1]}" for note in notes)
        )
    return desired


def _matched(entry: Entry, gpus: tuple[Gpu, ...], notes: list[str]) -> list[Gpu]:
    """The GPUs an entry selects (devices, then device-filter)."""
    if entry.devices == "all":
        chosen = list(gpus)
    else:
        chosen = []
        for index in entry.devices:
            if index >= len(gpus):
                notes.append(
                    f"{entry.devices_mark}: GPU {index} does not exist (this node has"
                    + (f" GPUs 0-{len(gpus) - 1}" if gpus else " no GPU")
                    + "); skipped"
                )
            else:
                chosen.append(gpus[index])
    if entry.device_filter is not None:
        chosen = [
            g
            for g in chosen
            if any(f.matches(g.pci_device_id, g.pci_subsystem_id) for f in entry.device_filter)
        ]
    return chosen


def covered(cfg: MigConfigFile, name: str, inventory: Inventory) -> set[int]:
    """The GPUs some entry of config `name` selects (whether or not it changes them)."""
    notes: list[str] = []
    return {g.index for entry in cfg.configs[name] for g in _matched(entry, inventory.gpus, notes)}


def _counts(
    entry: Entry, gpus: list[Gpu], errors: list[str]
) -> tuple[dict[int, int], dict[int, tuple[Shape, ...]]] | None:
    """The entry's counts by profile id for GPUs of one model; None (and errors) if invalid."""
    gpu = gpus[0]
    if entry.mig_enabled and not gpu.mig_capable:
        errors.append(f"{entry.mark}: {_gpu_label(gpus)} does not support MIG")
        return None
    geometry = Geometry.of(gpu)
    counts: dict[int, int] = {}
    ci_demand: dict[int, list[int]] = {}  # GI profile id -> CI sizes asked for
    failed = False
    for pc in entry.mig_devices:
        profile = find_profile(gpu, pc.name)
        if profile is None:
            valid = ", ".join(p.name for p in gpu.profiles)
            verb = "have" if len(gpus) > 1 else "has"
            errors.append(
                f"{pc.mark}: {_gpu_label(gpus)} {verb} no MIG profile {pc.name}; valid: {valid}"
            )
            failed = True
        elif not pc.profile.full:
            failed |= not _ci_demand(pc, profile, gpus, ci_demand, errors)
        elif pc.count > profile.instance_count:
            verb = "hold" if len(gpus) > 1 else "holds"
            errors.append(
                f"{pc.mark}: {_gpu_label(gpus)} {verb} at most"
                f" {profile.instance_count}x{pc.name}; asked for {pc.count}"
            )
            failed = True
        elif pc.count:
            counts[profile.id] = counts.get(profile.id, 0) + pc.count
    if failed:
        return None
    shapes: dict[int, tuple[Shape, ...]] = {}
    for pid, sizes in ci_demand.items():
        g = geometry.profile(pid).slice_count
        packed = compute.pack(g, sizes) or ()
        fulls = (compute.full(g),) * counts.get(pid, 0)
        shapes[pid] = tuple(sorted(fulls + packed, reverse=True))
        counts[pid] = len(shapes[pid])
        if counts[pid] > geometry.profile(pid).instance_count:
            verb = "hold" if len(gpus) > 1 else "holds"
            errors.append(
                f"{entry.mark}: {_gpu_label(gpus)} {verb} at most"
                f" {geometry.profile(pid).instance_count} GPU instances of"
                f" {geometry.profile(pid).name}; the compute instances asked for need"
                f" {counts[pid]}"
            )
            failed = True
    if failed:
        return None
    if counts and not geometry.fits_counts(counts):
        names = {p.id: p.name for p in gpu.profiles}
        asked = describe({names[pid]: n for pid, n in counts.items()})
        errors.append(
            f"{entry.mark}: {asked} do not fit together on {_gpu_label(gpus)}"
            f" ({gpu.memory_slice_count} memory slices, no valid placement for all of them)"
        )
        return None
    return counts, shapes


def _ci_demand(
    pc: ProfileCount,
    profile: GiProfile,
    gpus: list[Gpu],
    demand: dict[int, list[int]],
    errors: list[str],
) -> bool:
    """Record `pc` (a compute-instance profile) as CI sizes wanted in GIs of `profile`."""
    c, g = pc.profile.c, profile.slice_count
    if c not in compute.sizes_offered(g):
        offered = ", ".join(
            f"{n}c.{profile.name}" if n != g else profile.name for n in compute.sizes_offered(g)
        )
        errors.append(
            f"{pc.mark}: {_gpu_label(gpus)} {'have' if len(gpus) > 1 else 'has'} no"
            f" compute-instance profile {pc.name}; a {profile.name} GPU instance offers"
            f" {offered}"
        )
        return False
    most = profile.instance_count * len(compute.starts(g, c))
    if pc.count > most:  # before packing: a huge count must not build a huge list
        errors.append(
            f"{pc.mark}: {_gpu_label(gpus)} {'hold' if len(gpus) > 1 else 'holds'} at most"
            f" {most}x{pc.name}; asked for {pc.count}"
        )
        return False
    if pc.count:
        demand.setdefault(profile.id, []).extend([c] * pc.count)
    return True
