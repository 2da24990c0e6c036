"""MIG writes through NVML: mode, GPU instances with explicit placements, compute instances.

Writes never swallow an error: every NVML failure surfaces as NvmlError with its code.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.nvml.codes import INVALID_ARGUMENT, NOT_SUPPORTED, message_for
from nodeagent.nvml.inventory import Placement
from nodeagent.nvml.session import NvmlSession

# NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE constants by compute-slice count N.
# NVML_COMPUTE_INSTANCE_PROFILE_* constants by compute slices (1_SLICE_REV1 = 7 is Hopper's
# 26-SM CI of a double-memory 1g GI).
_CI_PROFILES_FOR_SLICES = {1: (0, 7), 2: (1,), 3: (2,), 4: (3,), 6: (6,), 7: (4,), 8: (5,)}


@dataclass(frozen=True)
class MigModeResult:
    current: bool
    pending: bool
    activation_status: int  # NVML return code of the activation (0 = done)

    @property
    def is_pending(self) -> bool:
        return self.current != self.pending


class MigWriter:
    """Mutating MIG calls for one node. Each names the GPU index in its errors."""

    def __init__(self, session: NvmlSession) -> None:
        self.session = session

    def _device(self, index: int) -> Any:
        return self.session.call("nvmlDeviceGetHandleByIndex", index, context=f"GPU {index}")

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeResult:
        """Enable or disable MIG mode; read back current and pending.

        The activation status NVML returns is not an exception: on Ampere the change stays
        pending until a GPU reset, and a busy GPU leaves it pending with IN_USE.
        nvidia-smi equivalent: `nvidia-smi -i N -mig 1|0`.
        """
        dev = self._device(index)
        status = self.session.call(
            "nvmlDeviceSetMigMode", dev, 1 if enabled else 0, context=f"GPU {index}"
        )
        current, pending = self.session.call("nvmlDeviceGetMigMode", dev)
        return MigModeResult(bool(current), bool(pending), int(status))

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending) MIG mode. nvidia-smi equivalent: `nvidia-smi -i N -q` (MIG Mode)."""
        current, pending = self.session.call("nvmlDeviceGetMigMode", self._device(index))
        return bool(current), bool(pending)

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        """Create a GI of `profile_id` at an explicit placement; return its GI id.

        nvidia-smi equivalent: `nvidia-smi mig -i N -cgi PROFILE:START` (explicit placement).
        """
        dev = self._device(index)
        where = f"GPU {index}, profile id {profile_id} at placement {placement}"
        p = self.session.lib.c_nvmlGpuInstancePlacement_t()
        p.start, p.size = placement.start, placement.size
        gi = self.session.call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            dev,
            profile_id,
            ctypes.byref(p),
            context=where,
        )
        return int(self.session.call("nvmlGpuInstanceGetInfo", gi, context=where).id)

    def _gpu_instance(self, index: int, gi_id: int) -> Any:
        return self.session.call(
            "nvmlDeviceGetGpuInstanceById",
            self._device(index),
            gi_id,
            context=f"GPU {index} GI {gi_id}",
        )

    def create_compute_instance(
        self, index: int, gi_id: int, slice_count: int, start: int = 0, full: bool = True
    ) -> int:
        """Create a CI of `slice_count` compute slices at `start` inside the GI; return its id.
        The full CI (`full`) is created as the driver's default one: of the CI profiles that
        span the GI, the one with the most SMs (on Hopper a 1g GI with double memory offers
        1_SLICE_REV1, 26 SMs, beside 1_SLICE). A smaller CI gets an explicit placement.

        nvidia-smi equivalent: `nvidia-smi mig -i N -gi GI -cci PROFILE` (`-cci` alone for the
        default full CI).
        """
        where = f"GPU {index} GI {gi_id}"
        gi = self._gpu_instance(index, gi_id)
        lib = self.session.lib
        infos = []
        for constant in _CI_PROFILES_FOR_SLICES.get(slice_count, ()):
            info = self.session.call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                constant,
                lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                context=where,
                absent=(NOT_SUPPORTED, INVALID_ARGUMENT),
            )
            if info is not None and int(info.sliceCount) == slice_count:
                infos.append(info)
        if not infos:
            raise NvmlError(
                NOT_SUPPORTED, "nvmlGpuInstanceCreateComputeInstance", message_for(3), where
            )
        if full:
            info = max(infos, key=lambda i: int(i.multiprocessorCount))
            ci = self.session.call(
                "nvmlGpuInstanceCreateComputeInstance", gi, info.id, context=where
            )
        else:
            info = infos[0]
            placement = lib.c_nvmlComputeInstancePlacement_t()
            placement.start, placement.size = start, slice_count
            ci = self.session.call(
                "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
                gi,
                info.id,
                ctypes.byref(placement),
                context=f"{where}, {slice_count}c at {start}",
            )
        return int(self.session.call("nvmlComputeInstanceGetInfo", ci, context=where).id)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        """Destroy one CI. IN_USE while processes run on it.

        nvidia-smi equivalent: `nvidia-smi mig -i N -gi GI -ci CI -dci`.
        """
        where = f"GPU {index} GI {gi_id} CI {ci_id}"
        gi = self._gpu_instance(index, gi_id)
        ci = self.session.call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id, context=where)
        self.session.call("nvmlComputeInstanceDestroy", ci, context=where)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy one GI (its CIs first). IN_USE while it has CIs or processes.

        nvidia-smi equivalent: `nvidia-smi mig -i N -gi GI -dgi`.
        """
        gi = self._gpu_instance(index, gi_id)
        self.session.call("nvmlGpuInstanceDestroy", gi, context=f"GPU {index} GI {gi_id}")


COMPUTEMODE_DEFAULT = 0
COMPUTEMODE_EXCLUSIVE_PROCESS = 3


class ComputeModeWriter:
    """Compute mode of full GPUs (MPS can ask for EXCLUSIVE_PROCESS)."""

    def __init__(self, session: NvmlSession) -> None:
        self.session = session

    def compute_mode(self, index: int) -> int:
        dev = self.session.call("nvmlDeviceGetHandleByIndex", index, context=f"GPU {index}")
        return int(self.session.call("nvmlDeviceGetComputeMode", dev, context=f"GPU {index}"))

    def set_exclusive_process(self, index: int, exclusive: bool) -> None:
        """EXCLUSIVE_PROCESS (only the MPS server opens the GPU) or back to DEFAULT.

        nvidia-smi equivalent: `nvidia-smi -i N -c EXCLUSIVE_PROCESS` / `-c DEFAULT`.
        """
        dev = self.session.call("nvmlDeviceGetHandleByIndex", index, context=f"GPU {index}")
        mode = COMPUTEMODE_EXCLUSIVE_PROCESS if exclusive else COMPUTEMODE_DEFAULT
        self.session.call("nvmlDeviceSetComputeMode", dev, mode, context=f"GPU {index}")
