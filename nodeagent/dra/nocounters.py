"""What the node publishes when the API server drops the ResourceSlices' counters (its
`DRAPartitionableDevices` feature gate is off): only devices that cannot overlap. Pure.

Without counters the scheduler cannot see that a GPU and one of its MIG placements, or two
overlapping placements, share memory slices, and would hand them to two claims. So: a GPU with
MIG off is its whole self only; a GPU with MIG on offers the slices it has (each one device, as
the partitionable devices name them, so a claim prepares it as it is), never its whole self
and never a slice that would have to be made.
"""

from __future__ import annotations

from collections.abc import Collection

from nodeagent.dra.devices import (
    MAX_DEVICES_PER_SLICE,
    SliceSpec,
    dns_label,
    gpu_device,
    mig_device,
)
from nodeagent.nvml.inventory import Inventory


def _no_counters(device: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in device.items() if k != "consumesCounters"}


def safe_slices(
    inventory: Inventory, node: str, driver: str, gpus: Collection[int] | None = None
) -> list[SliceSpec]:
    """One ResourceSlice per GPU (no counter sets): the whole GPU while MIG is off, the MIG
    slices that exist while it is on."""
    prefix = f"{node}-{dns_label(driver)}"
    base = {"driver": driver, "nodeName": node}
    out: list[SliceSpec] = []
    for gpu in inventory.gpus:
        if gpus is not None and gpu.index not in gpus:
            continue
        if not gpu.mig_current:
            devices = [_no_counters(gpu_device(inventory, gpu))]
        else:
            profiles = {p.id: p for p in gpu.profiles}
            devices = [
                _no_counters(mig_device(inventory, gpu, profiles[s.profile_id], s.placement))
                for s in sorted(gpu.slices, key=lambda s: s.placement.start)
                if s.ci_id is not None and s.profile_id in profiles
            ]
            devices = list({d["name"]: d for d in devices}.values())  # one device a GI
        for k in range(0, max(len(devices), 1), MAX_DEVICES_PER_SLICE):
            part = "" if k == 0 else f"-{k // MAX_DEVICES_PER_SLICE}"
            spec = {**base, "devices": devices[k : k + MAX_DEVICES_PER_SLICE]}
            out.append(SliceSpec(f"{prefix}-gpu-{gpu.index}{part}", spec))
    return out
