"""The records' one device type built by where a device is, for tests of the ownership record."""

from __future__ import annotations

from nodeagent.state.held import PreparedClaim, PreparedDevice, on_gpu


def held(
    gpu_uuid: str,
    start: int | None = None,
    size: int | None = None,
    profile_id: int | None = None,
    *,
    shared: bool = False,
) -> PreparedDevice:
    """A device the record holds, by where it is (the record's one device type)."""
    placement = None if start is None or size is None else (start, size, profile_id or 0)
    return on_gpu(0, gpu_uuid, placement, shared=shared)


def owned(namespace: str, name: str, devices: tuple[PreparedDevice, ...]) -> PreparedClaim:
    """A claim the record holds from its traces (no state): its devices."""
    return PreparedClaim(namespace, name, None, devices)
