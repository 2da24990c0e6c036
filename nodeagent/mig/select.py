"""Resolve one named config of a file against the node's GPUs: what each GPU should become.

Checks everything that needs the node (device indices, profiles the model lacks, counts over
capacity, combinations with no valid placement) and reports all problems at once. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.errors import ConfigError, NothingMatched
from nodeagent.mig.config import Entry, MigConfigFile, config_error
from nodeagent.mig.geometry import Geometry
from nodeagent.nvml.inventory import Gpu, Inventory


@dataclass(frozen=True)
class Desired:
    """What one GPU should be: MIG mode, and slices by NVML profile id."""

    gpu: int
    mig_enabled: bool
    counts: dict[int, int]
    source: str  # "file:line:col" of the config entry, for messages

    def named_counts(self, gpu: Gpu) -> dict[str, int]:
        by_id = {p.id: p.name for p in gpu.profiles}
        return {by_id[pid]: n for pid, n in sorted(self.counts.items()) if n}


def describe(counts: dict[str, int]) -> str:
    return " + ".join(f"{n}x{name}" for name, n in counts.items()) or "no slices"


def _gpu_label(gpus: list[Gpu]) -> str:
    indices = ", ".join(str(g.index) for g in gpus)
    return f"GPU{'s' if len(gpus) > 1 else ''} {indices} ({gpus[0].name})"


def resolve(cfg: MigConfigFile, name: str, inventory: Inventory) -> dict[int, Desired]:
    """The desired state of every GPU the config `name` covers; GPUs it does not cover are
    left out (and left alone). Raises ConfigError (all problems) or NothingMatched."""
    if name not in cfg.configs:
        known = ", ".join(sorted(cfg.configs)) or "none"
        raise ConfigError(f"{cfg.source}: no config named {name!r}; the file defines: {known}")
    gpus = inventory.gpus
    errors: list[str] = []
    desired: dict[int, Desired] = {}
    for entry in cfg.configs[name]:
        fresh = []
        for gpu in _matched(entry, gpus, errors):
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
                    desired[gpu.index] = Desired(
                        gpu.index, entry.mig_enabled, counts, str(entry.mark)
                    )
                else:
                    desired[gpu.index] = Desired(gpu.index, entry.mig_enabled, {}, str(entry.mark))
    if errors:
        raise config_error(cfg.source, errors)
    if not desired:
        raise NothingMatched(
            f"{cfg.source}: config {name!r} matches no GPU on this node"
            f" ({', '.join(f'{g.index}: {g.name} 0x{g.pci_device_id:08X}' for g in gpus)})"
        )
    return desired


def _matched(entry: Entry, gpus: tuple[Gpu, ...], errors: list[str]) -> list[Gpu]:
    if entry.devices == "all":
        chosen = list(gpus)
    else:
        chosen = []
        for index in entry.devices:
            if index >= len(gpus):
                errors.append(
                    f"{entry.devices_mark}: GPU {index} does not exist; this node has"
                    f" GPUs 0-{len(gpus) - 1}"
                    if gpus
                    else f"{entry.devices_mark}: this node has no GPU"
                )
            else:
                chosen.append(gpus[index])
    if entry.device_filter is not None:
        chosen = [g for g in chosen if g.pci_device_id in entry.device_filter]
    return chosen


def _counts(entry: Entry, gpus: list[Gpu], errors: list[str]) -> dict[int, int] | None:
    """The entry's counts by profile id for GPUs of one model; None (and errors) if invalid."""
    gpu = gpus[0]
    if entry.mig_enabled and not gpu.mig_capable:
        errors.append(f"{entry.mark}: {_gpu_label(gpus)} does not support MIG")
        return None
    geometry = Geometry.of(gpu)
    counts: dict[int, int] = {}
    failed = False
    for pc in entry.mig_devices:
        profile = geometry.by_name(pc.name)
        if profile is None:
            valid = ", ".join(p.name for p in gpu.profiles)
            verb = "have" if len(gpus) > 1 else "has"
            errors.append(
                f"{pc.mark}: {_gpu_label(gpus)} {verb} no MIG profile {pc.name}; valid: {valid}"
            )
            failed = True
        elif pc.count > profile.instance_count:
            verb = "hold" if len(gpus) > 1 else "holds"
            errors.append(
                f"{pc.mark}: {_gpu_label(gpus)} {verb} at most"
                f" {profile.instance_count}x{pc.name}; asked for {pc.count}"
            )
            failed = True
        elif pc.count:
            counts[profile.id] = pc.count
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
    return counts
