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
GI_IDS = range(0, 64)
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


def gi_id_for(memory_slices: int, start: int, size: int) -> int | None:
    """The GI id the driver gives an instance at (start, size): a binary tree over the memory
    slices, 0 for the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the eighths (every
    documented `nvidia-smi mig -lgi` listing fits it, with the identity slice mapping that
    H100 listings show; some A100s swap the halves, which the emulator does not model).
    None when the size is not a power-of-two fraction of the GPU."""
    if size <= 0 or memory_slices % size or (memory_slices // size) & (memory_slices // size - 1):
        return None
    parts = memory_slices // size
    return parts - 1 + start // size


def ci_starts(gi_slices: int, ci_slices: int) -> list[int]:
    """Where a compute instance of `ci_slices` may start in a GI of `gi_slices` compute slices.
    A GI offers its full CI, and a smaller size c when 2c <= g + 1 (no 3c in a 4g; 3c and 4c
    in a 7g; one 2c in a 3g, as real `nvidia-smi mig -lcip` listings show); a CI starts at a
    multiple of the power of two at or above its size."""
    if ci_slices == gi_slices:
        return [0]
    if ci_slices > gi_slices or 2 * ci_slices > gi_slices + 1:
        return []
    step = 1
    while step < ci_slices:
        step *= 2
    return list(range(0, gi_slices - ci_slices + 1, step))


def ci_multiprocessors(model: DeviceModel, gi: ProfileModel, ci_slices: int) -> int:
    """SMs of a compute instance: the GI's own for the full CI; else `ci_slices` times the SMs
    of one compute slice (the 1-slice profile's). Documented for A100/A30 (14 per slice) and
    for a 1c on Hopper (16 SMs, while a 3g GI has 60, not 3 x 16: Hopper's GI counts are not
    linear); other partial CIs on Hopper are not documented and follow the same rule."""
    if ci_slices == gi.slice_count:
        return gi.multiprocessor_count
    one = min(
        (p.multiprocessor_count for p in model.profiles if p.slice_count == 1),
        default=gi.multiprocessor_count // gi.slice_count,
    )
    return one * ci_slices


def ci_conflict(gi: GiState, gi_slices: int, profile_id: int, start: int) -> str | None:
    """Why a CI of compute-instance profile `profile_id` at `start` cannot join `gi`."""
    slices = CI_SLICES.get(profile_id)
    if slices is None or start not in ci_starts(gi_slices, slices):
        return f"no compute-instance profile {profile_id} at {start} in a {gi_slices}-slice GI"
    for ci in gi.cis.values():
        other = CI_SLICES.get(ci.profile_id, gi_slices)
        if ci.start < start + slices and start < ci.start + other:
            return f"compute slices {start}-{start + slices - 1} overlap CI {ci.id}"
    return None


def device_memory(model: DeviceModel, p: ProfileModel | None) -> tuple[int, int]:
    """(total, reserved) bytes of a whole GPU (`p` None) or of a MIG device of profile `p`."""
    if p is None:
        return model.memory_total_bytes, model.memory_reserved_bytes
    return p.memory_size_mb * MIB, 0
