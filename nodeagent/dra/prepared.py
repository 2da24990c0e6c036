"""Claimed devices -> prepared devices: what each device a claim's allocation names
(nodeagent.dra.claims `claimed_devices`) is on this node's GPUs, as the ownership record keeps
it (nodeagent.state.held `PreparedDevice`) and the engine plans it (nodeagent.reconcile.claims).
Pure.
"""

from __future__ import annotations

from collections.abc import Collection

from nodeagent.base.errors import ConfigError
from nodeagent.dra.claims import ClaimedDevice
from nodeagent.nvml.inventory import Inventory
from nodeagent.state.held import PreparedDevice


def prepared_devices(
    inventory: Inventory, claimed: list[ClaimedDevice], managed: Collection[int] | None = None
) -> list[PreparedDevice]:
    """What each claimed device is on this node: the GPU, profile and placement it names, read
    off the GPUs' fixed facts. Whether its slice is there already (`existed`, what its release
    leaves) is the engine's to decide, under the MIG writer lock (nodeagent.reconcile.claims
    `settled`): here it is False. Raises ConfigError for a GPU, profile or placement this node
    does not have, or a share larger than its device."""
    gpus = {g.index: g for g in inventory.gpus if managed is None or g.index in managed}
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
        out.append(
            PreparedDevice(
                c.request, c.pool, c.device, gpu.index, gpu.uuid, profile.id, profile.name,
                at.start, at.size, mps=mps, admin=c.admin, shared=c.ref.shared,
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
