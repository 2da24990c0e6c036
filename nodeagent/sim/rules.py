"""The hardware's rules, shared by the emulated NVML calls and the state-file check.

One place says what the GPU allows (where a GPU instance fits, what a compute instance takes,
how much memory a device has), so a state file is held to exactly the rules the calls enforce.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodeagent.sim.models import MIB, DeviceModel, ProfileModel
from nodeagent.sim.state import GiState

# Compute-instance profiles: NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE constant -> N.
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
GI_IDS = range(1, 64)  # what the driver hands out on create
CI_IDS = range(0, 16)
# nvmlDeviceSetComputeMode: DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS (EXCLUSIVE_THREAD is gone).
COMPUTE_MODES = (0, 2, 3)
MAX_PID = 4194304  # Linux PID_MAX_LIMIT


def short_name(p: ProfileModel) -> str:
    return p.name.removeprefix("MIG ")


def gi_conflict(
    gis: Iterable[GiState], model: DeviceModel, p: ProfileModel, start: int
) -> str | None:
    """Why a GPU instance of profile `p` at placement `start` cannot join `gis`, or None.

    `start` must be one of p's placements. The reasons are those NVML answers with
    INSUFFICIENT_RESOURCES: overlapping memory slices, the profile's instance count, one
    media-extension (+me) instance per GPU, the GPU's compute slices.
    """
    existing = list(gis)
    size = next(n for s, n in p.placements if s == start)
    for gi in existing:
        if gi.start < start + size and start < gi.start + gi.size:
            return (
                f"memory slices {start}-{start + size - 1} overlap GI {gi.id}"
                f" (slices {gi.start}-{gi.start + gi.size - 1})"
            )
    if sum(gi.profile_id == p.id for gi in existing) >= p.instance_count:
        return f"{short_name(p)} allows at most {p.instance_count} instances"
    profiles = [model.profile_by_id(gi.profile_id) for gi in existing]
    known = [q for q in profiles if q is not None]
    if p.name.endswith("+me") and any(q.name.endswith("+me") for q in known):
        return "only one +me instance fits on a GPU"
    used = sum(q.slice_count for q in known)
    if used + p.slice_count > model.compute_slices:
        free = model.compute_slices - used
        return f"{short_name(p)} needs {p.slice_count} compute slices and {free} are free"
    return None


def ci_slices_used(gi: GiState) -> int:
    """Compute slices taken by the compute instances of a GPU instance."""
    return sum(CI_SLICES[ci.profile_id] for ci in gi.cis.values())


def device_memory(model: DeviceModel, p: ProfileModel | None) -> tuple[int, int]:
    """(total, reserved) bytes of a whole GPU (`p` None) or of a MIG device of profile `p`."""
    if p is None:
        return model.memory_total_bytes, model.memory_reserved_bytes
    return p.memory_size_mb * MIB, 0
