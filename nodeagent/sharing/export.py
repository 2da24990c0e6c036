"""`nodeagent sharing export`: what each GPU offers now, as a nodeagent/v1 sharing config that
`sharing assert` passes and `sharing apply` leaves as it is. Pure.

The running MPS daemon's limits are written out as they read back (the thread percentage, each
GPU's pinned memory limit), so that applying the export changes nothing. The daemon keeps no
replica count: `replicas` is 100 / its thread percentage, rounded (a replica count the device
plugin advertises is not visible on the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodeagent.mig.generate import export_current
from nodeagent.nvml.inventory import Inventory
from nodeagent.sharing.config import MAX_MPS_REPLICAS, VERSION

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class RunningMps:
    """The MPS daemon as it runs, read back from it: the GPUs it serves (NVML indices), its
    default thread percentage (None: it did not say) and pinned limit per GPU (None: unset)."""

    gpus: tuple[int, ...] = ()
    thread_percentage: float | None = None
    pinned_bytes: dict[int, int | None] = field(default_factory=dict)


def size_text(n: int) -> str:
    """Bytes as a size the sharing config reads back to the same bytes: whole GiB as '32G',
    else whole MiB ('35942M'; the daemon takes whole MiB)."""
    return f"{n // GIB}G" if n % GIB == 0 else f"{n // MIB}M"


def _mps_share(running: RunningMps, pinned: int | None) -> dict[str, Any]:
    share: dict[str, Any] = {"replicas": 2}
    pct = running.thread_percentage
    if pct is not None and 1 <= round(pct) <= 100:
        share["replicas"] = max(2, min(MAX_MPS_REPLICAS, round(100 / pct)))
        share["thread-percentage"] = round(pct)
    if pinned is not None and pinned >= MIB:
        share["pinned-memory"] = size_text(pinned)
    return share


def export_sharing(inventory: Inventory, running: RunningMps) -> dict[str, Any]:
    """The sharing config named `current`: MIG GPUs with their MIG devices, the daemon's GPUs
    under `mps` (one entry per pinned limit), the others whole (time-slicing leaves no trace
    on a GPU: such GPUs read as whole)."""
    entries: list[dict[str, Any]] = []
    for entry in export_current(inventory)["current"]:
        if entry["mig-enabled"]:
            entries.append(
                {"devices": entry["devices"], "mig": {"mig-devices": entry["mig-devices"]}}
            )
            continue
        whole = [i for i in entry["devices"] if i not in running.gpus]
        if whole:
            entries.append({"devices": whole, "whole": {}})
    by_limit: dict[int | None, list[int]] = {}
    for gpu in sorted(running.gpus):
        by_limit.setdefault(running.pinned_bytes.get(gpu), []).append(gpu)
    for pinned, gpus in by_limit.items():
        entries.append({"devices": gpus, "mps": _mps_share(running, pinned)})
    return {"version": VERSION, "sharing-configs": {"current": entries}}
