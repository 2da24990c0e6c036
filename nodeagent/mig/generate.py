"""Generated configs (`mig generate-config`) and the current geometry (`mig export`). Pure.

Names follow mig-parted's defaults, so `nvidia.com/mig.config` values already in use keep
working: all-disabled, all-enabled, all-<profile> ('+' written '.': all-1g.18gb.me) at the
most instances that fit, and all-balanced.
"""

from __future__ import annotations

from typing import Any

from nodeagent.mig.config import MigConfigFile, dump_config, parse_config
from nodeagent.mig.geometry import Geometry
from nodeagent.mig.plan import device_counts
from nodeagent.nvml.inventory import GiProfile, Gpu, Inventory


def config_name(profile: str) -> str:
    return "all-" + profile.replace("+", ".")


def _plain(gpu: Gpu, slices: int) -> GiProfile | None:
    """The plain profile of `slices` compute slices: no +me, the smallest memory."""
    plain = [p for p in gpu.profiles if p.slice_count == slices and not p.name.endswith("+me")]
    return min(plain, key=lambda p: (p.memory_bytes, p.id), default=None)


def balanced(gpu: Gpu) -> dict[str, int]:
    """2x1g + 1x2g + 1x3g of the plain profiles on 8-slot GPUs; 2x1g + 1x2g on A30."""
    wanted = {1: 2, 2: 1} if gpu.memory_slice_count <= 4 else {1: 2, 2: 1, 3: 1}
    counts = {}
    for slices, n in wanted.items():
        p = _plain(gpu, slices)
        if p is not None:
            counts[p.name] = n
    return counts


def generate_configs(inventory: Inventory) -> dict[str, list[dict[str, Any]]]:
    """Default configs for the GPU models present (one entry per model, by device filter)."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    models: dict[int, Gpu] = {}
    for gpu in inventory.gpus:
        if gpu.mig_capable:
            models.setdefault(gpu.pci_device_id, gpu)
    per_profile: dict[str, list[dict[str, Any]]] = {}
    for device_id, gpu in models.items():
        geometry = Geometry.of(gpu)
        base = {"device-filter": f"0x{device_id:08X}", "devices": "all", "mig-enabled": True}
        for p in gpu.profiles:
            per_profile.setdefault(config_name(p.name), []).append(
                {**base, "mig-devices": {p.name: geometry.max_count(p)}}
            )
        configs.setdefault("all-balanced", []).append({**base, "mig-devices": balanced(gpu)})
    configs.update(per_profile)
    return configs


GENERATED_SOURCE = "the configs generated from this node's GPUs"


class GeneratedConfigs:
    """The configs of generate_configs() as a parsed file: what the agent and `mig apply` use
    when no MIG config file is given, as mig-manager does since v0.14.0 (it generates its
    config from the hardware). Generated again only when the GPU models change."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._file: MigConfigFile | None = None

    def load(self, inventory: Inventory) -> MigConfigFile:
        key = tuple((g.pci_device_id, tuple(p.name for p in g.profiles)) for g in inventory.gpus)
        if self._file is None or key != self._key:
            text = dump_config(generate_configs(inventory))
            self._key, self._file = key, parse_config(text, GENERATED_SOURCE)
        return self._file


def export_current(inventory: Inventory) -> dict[str, list[dict[str, Any]]]:
    """The node's geometry as one config named `current`, which `mig apply` accepts. A GPU
    instance without its compute instance (an interrupted apply) is not part of it. MIG
    devices are counted by their profile as mig-parted exports them: '3g.71gb' for a full CI,
    '1c.3g.71gb' for a smaller one."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for gpu in inventory.gpus:
        counts = device_counts(gpu) if gpu.mig_current else {}
        key = (gpu.mig_current, tuple(sorted(counts.items())))
        groups.setdefault(key, []).append(gpu.index)
    entries: list[dict[str, Any]] = []
    for (enabled, counts_items), indices in groups.items():
        entry: dict[str, Any] = {"devices": indices, "mig-enabled": enabled}
        if enabled:
            entry["mig-devices"] = dict(counts_items)
        entries.append(entry)
    return {"current": entries}
