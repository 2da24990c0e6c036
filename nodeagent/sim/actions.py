"""What a user or the hardware does outside NVML: processes start and end, a GPU is reset."""

from __future__ import annotations

from nodeagent.errors import SimError
from nodeagent.sim.base import (
    _KIND_DEVICE,
    _KIND_MIG,
    SimBase,
    _handle,
)
from nodeagent.sim.models import (
    MIB,
)
from nodeagent.sim.state import CiState, GiState, GpuState, ProcessState


class UserActions(SimBase):
    # -- outside NVML: what a user or the hardware does -------------------------------------

    def attach(self, device: str, pid: int, memory_bytes: int, load: float = 1.0) -> str:
        """Start an emulated process on a GPU (index or UUID) or MIG device (MIG UUID).

        Returns a description of where it runs. Raises SimError for an unknown device, a pid
        already attached, a full GPU with MIG enabled, or memory over what is free.
        """
        with self.edit() as state:
            if any(p.pid == pid for p in state.processes):
                raise SimError(f"pid {pid} is already attached; detach it first")
            gpu, gi, ci = self._find_device(device)
            if gi is None and gpu.mig_current:
                raise SimError(
                    f"GPU {gpu.index} has MIG enabled: attach to one of its MIG devices "
                    "(a MIG UUID from 'nodeagent status')"
                )
            handle = (
                _handle(_KIND_MIG, gpu.index, gi.id, ci.id)
                if gi is not None and ci is not None
                else _handle(_KIND_DEVICE, gpu.index)
            )
            total, used = self._memory(handle)
            free = total - used
            if memory_bytes > free:
                raise SimError(
                    f"device {device} has {free // MIB} MiB free; "
                    f"cannot attach {memory_bytes // MIB} MiB"
                )
            state.processes.append(
                ProcessState(
                    pid=pid,
                    gpu=gpu.index,
                    memory_bytes=memory_bytes,
                    gi_id=gi.id if gi else None,
                    ci_id=ci.id if ci else None,
                    load=load,
                )
            )
        where = f"GPU {gpu.index}" + (f" GI {gi.id} CI {ci.id}" if gi and ci else "")
        return where

    def detach(self, pid: int) -> None:
        """End an emulated process; raises SimError if no such pid is attached."""
        with self.edit() as state:
            before = len(state.processes)
            state.processes = [p for p in state.processes if p.pid != pid]
            if len(state.processes) == before:
                raise SimError(f"no emulated process with pid {pid} is attached")

    def reset(self, index: int) -> None:
        """`nvidia-smi -r -i INDEX`: apply a pending MIG mode; instances do not survive.

        Raises SimError for an unknown GPU or one with processes on it.
        """
        with self.edit() as state:
            if not 0 <= index < len(state.gpus):
                raise SimError(f"GPU {index} does not exist (this node has {len(state.gpus)})")
            if any(p.gpu == index for p in state.processes):
                raise SimError(f"GPU {index} cannot be reset: processes are running on it")
            gpu = state.gpus[index]
            gpu.gis.clear()
            gpu.mig_current = gpu.mig_pending

    def _find_device(self, device: str) -> tuple[GpuState, GiState | None, CiState | None]:
        gpus = self.state.gpus
        if device.isdigit():
            if int(device) >= len(gpus):
                raise SimError(f"GPU {device} does not exist (this node has {len(gpus)} GPUs)")
            return gpus[int(device)], None, None
        for gpu in gpus:
            if gpu.uuid == device:
                return gpu, None, None
            for gi, ci in self._mig_devices(gpu):
                if ci.uuid == device:
                    return gpu, gi, ci
        raise SimError(f"no GPU or MIG device {device!r} on this node (see 'nodeagent status')")
