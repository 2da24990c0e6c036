"""Resolve one named sharing config against the node's GPUs: one intent per covered GPU. Pure.

The node checks (device indices, device filters, MIG capability, profiles, counts, placements)
are select.resolve's: every sharing entry becomes one MIG entry (MIG on with its slices for `mig`,
off for the others) and the MIG resolution maps back to the entries by their position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nodeagent.base.configfile import config_error
from nodeagent.base.errors import ConfigError, NothingMatched
from nodeagent.base.logs import get_logger, listing
from nodeagent.mig.config import Entry, MigConfigFile
from nodeagent.mig.select import MigTarget, _gpu_label, resolve
from nodeagent.mps.settings import parse_size
from nodeagent.nvml.inventory import Gpu, Inventory
from nodeagent.settings import Mps
from nodeagent.sharing.config import (
    MigShare,
    MpsShare,
    SharingEntry,
    SharingFile,
    TimeSlicing,
    Whole,
)

log = get_logger("nodeagent.sharing")


@dataclass(frozen=True)
class GpuIntent:
    gpu: int
    strategy: str  # "mig" | "mps" | "time-slicing" | "whole"
    replicas: int  # clients per GPU; 1 for mig and whole
    source: str  # "file:line:col" of the sharing entry


@dataclass(frozen=True)
class Resolution:
    intents: dict[int, GpuIntent]
    mig: dict[int, MigTarget]  # every covered GPU: MIG enabled with counts, or disabled
    mps: MpsShare | None  # the daemon-wide values; pinned_memory None (per GPU in `pinned`)
    mps_devices: tuple[int, ...]
    pinned: dict[int, str]  # GPU -> size text, from the MPS entries that set it


def resolve_sharing(
    cfg: SharingFile, name: str, inventory: Inventory, mig_file: MigConfigFile | None = None
) -> Resolution:
    """What every GPU the config `name` covers should become; GPUs it does not cover are left
    out. `mig_file` holds the configs that `mig: {mig-config: NAME}` entries name. Raises
    ConfigError (all problems of a stage at once) or NothingMatched (no GPU covered)."""
    if name not in cfg.configs:
        known = listing(sorted(cfg.configs))
        raise ConfigError(f"{cfg.source}: no config named {name!r}; the file defines: {known}")
    entries = cfg.configs[name]
    _check_references(entries, mig_file, cfg.source)
    as_mig = MigConfigFile(cfg.source, {name: tuple(_as_mig_entry(e) for e in entries)})
    notes: list[str] = []
    desired = resolve(as_mig, name, inventory, notes)
    for note in notes:  # a sharing config's skip: not a MIG config's event
        log.warning("sharing.config.skipped", config=name, reason=note)
    by_mark = {str(e.mark): e for e in entries}
    covered = {gpu: by_mark[d.source] for gpu, d in sorted(desired.items())}
    gpus = {g.index: g for g in inventory.gpus}
    errors: list[str] = []
    mig = dict(desired)
    referenced: dict[str, dict[int, MigTarget]] = {}
    for gpu, entry in covered.items():
        share = entry.share
        if isinstance(share, MigShare) and share.mig_config is not None and mig_file is not None:
            if share.mig_config not in referenced:
                referenced[share.mig_config] = _resolve_reference(entry, mig_file, inventory)
            found = _referenced(entry, gpu, share.mig_config, referenced, mig_file.source, errors)
            if found is not None:
                mig[gpu] = found
    mps, pinned = _mps(covered, gpus, errors)
    if errors:
        marks = [f"{e.mark}: " for e in entries]
        errors.sort(key=lambda m: next((i for i, k in enumerate(marks) if m.startswith(k)), 0))
        raise config_error(cfg.source, errors)  # in the order of the entries
    intents = {gpu: _intent(gpu, entry) for gpu, entry in covered.items()}
    mps_devices = tuple(gpu for gpu, i in intents.items() if i.strategy == "mps")
    return Resolution(intents, mig, mps, mps_devices, pinned)


def _as_mig_entry(entry: SharingEntry) -> Entry:
    share = entry.share
    enabled = isinstance(share, MigShare)
    profiles = share.profiles if isinstance(share, MigShare) and share.profiles else ()
    return Entry(
        entry.devices, entry.device_filter, enabled, profiles, entry.mark, entry.devices_mark
    )


def _check_references(
    entries: tuple[SharingEntry, ...], mig_file: MigConfigFile | None, source: str
) -> None:
    errors = []
    for entry in entries:
        share = entry.share
        if not isinstance(share, MigShare) or share.mig_config is None:
            continue
        if mig_file is None:
            errors.append(
                f"{entry.mark}: mig-config {share.mig_config!r} needs a MIG config file"
                " (mig-parted v1), and none was given"
            )
        elif share.mig_config not in mig_file.configs:
            known = listing(sorted(mig_file.configs))
            errors.append(
                f"{entry.mark}: mig-config {share.mig_config!r} is not in {mig_file.source};"
                f" it defines: {known}"
            )
    if errors:
        raise config_error(source, errors)


def _resolve_reference(
    entry: SharingEntry, mig_file: MigConfigFile, inventory: Inventory
) -> dict[int, MigTarget]:
    assert isinstance(entry.share, MigShare) and entry.share.mig_config is not None
    try:
        return resolve(mig_file, entry.share.mig_config, inventory)
    except NothingMatched:
        return {}
    except ConfigError as err:
        raise ConfigError(
            f"{entry.mark}: mig-config {entry.share.mig_config!r} does not fit this node: {err}"
        ) from err


def _referenced(
    entry: SharingEntry,
    gpu: int,
    ref: str,
    referenced: dict[str, dict[int, MigTarget]],
    mig_source: str,
    errors: list[str],
) -> MigTarget | None:
    found = referenced[ref].get(gpu)
    if found is None:
        errors.append(
            f"{entry.mark}: GPU {gpu}: mig-config {ref!r} ({mig_source}) does not cover it"
        )
        return None
    if not found.mig_enabled:
        errors.append(
            f"{entry.mark}: GPU {gpu}: mig-config {ref!r} ({found.source}) leaves MIG disabled on"
            " it; a mig entry must enable MIG (use 'whole: {}' for a whole GPU)"
        )
        return None
    return MigTarget(gpu, True, dict(found.counts), str(entry.mark))


def _mps(
    covered: dict[int, SharingEntry], gpus: dict[int, Gpu], errors: list[str]
) -> tuple[MpsShare | None, dict[int, str]]:
    """The daemon-wide MPS values and the per-GPU pinned memory; conflicts go to errors."""
    first: tuple[SharingEntry, MpsShare] | None = None
    reported: set[str] = set()
    pinned: dict[int, str] = {}
    too_big: dict[tuple[str, int], tuple[SharingEntry, str, list[Gpu]]] = {}
    for gpu, entry in covered.items():
        share = entry.share
        if not isinstance(share, MpsShare):
            continue
        if first is None:
            first = (entry, share)
        elif str(entry.mark) not in reported:
            other_entry, other = first
            for what, mine, theirs in (
                ("replicas", share.replicas, other.replicas),
                ("thread-percentage", share.thread_percentage, other.thread_percentage),
            ):
                if mine != theirs:
                    reported.add(str(entry.mark))
                    errors.append(
                        f"{entry.mark}: GPU {gpu}: MPS {what} {_show(mine)} differs from"
                        f" {_show(theirs)} at {other_entry.mark}; one MPS daemon serves all MPS"
                        f" GPUs and its {what} is daemon-wide: give every MPS entry the same"
                    )
        if share.pinned_memory is not None:
            gpu_info = gpus[gpu]
            if parse_size(share.pinned_memory, "pinned-memory") > gpu_info.memory_total_bytes:
                key = (str(entry.mark), gpu_info.pci_device_id)
                too_big.setdefault(key, (entry, share.pinned_memory, []))[2].append(gpu_info)
            else:
                pinned[gpu] = share.pinned_memory
    for entry, size, same in too_big.values():
        errors.append(
            f"{entry.mark}: {_gpu_label(same)}: pinned-memory {size} is more than the"
            f" {same[0].memory_total_bytes >> 20} MiB of memory a GPU has"
        )
    if first is None:
        return None, pinned
    share = first[1]
    return MpsShare(share.replicas, share.thread_percentage, None), pinned


def _show(value: int | None) -> str:
    return "unset" if value is None else str(value)


def _intent(gpu: int, entry: SharingEntry) -> GpuIntent:
    share = entry.share
    source = str(entry.mark)
    if isinstance(share, MpsShare):
        return GpuIntent(gpu, "mps", share.replicas, source)
    if isinstance(share, TimeSlicing):
        return GpuIntent(gpu, "time-slicing", share.replicas, source)
    if isinstance(share, Whole):
        return GpuIntent(gpu, "whole", 1, source)
    return GpuIntent(gpu, "mig", 1, source)


def sharing_mps(mps: Mps, res: Resolution) -> Mps:
    """The `mps` settings group as a resolved sharing config sets it: its MPS GPUs, the
    daemon-wide replicas and thread percentage, the pinned limits per GPU. The sharing config
    is then the source of replicas (not the device plugin's config)."""
    share = res.mps
    pinned = ",".join(f"{i}={size}" for i, size in sorted(res.pinned.items())) or None
    return dataclasses.replace(
        mps,
        enabled=bool(res.mps_devices),
        devices=res.mps_devices or None,
        replicas=share.replicas if share else mps.replicas,
        thread_percentage=share.thread_percentage if share else None,
        pinned_memory=pinned,
        device_plugin_config=None,
    )
