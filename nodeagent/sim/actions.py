"""What a user or the hardware does outside NVML: processes start and end, a GPU is reset, the
node reboots."""

from __future__ import annotations

import pynvml

from nodeagent.base.errors import NothingMatched, NvmlError, SimError
from nodeagent.sim.base import (
    _KIND_DEVICE,
    _KIND_MIG,
    SimBase,
    _handle,
)
from nodeagent.sim.health import checkpoint_energy, reboot_health, reset_health
from nodeagent.sim.models import MIB, load_model
from nodeagent.sim.rules import MAX_PID
from nodeagent.sim.state import CiState, GiState, GpuState, ProcessState


class UserActions(SimBase):
    # -- outside NVML: what a user or the hardware does -------------------------------------

    def attach(
        self, device: str, pid: int, memory_bytes: int, load: float = 1.0, mps_client: bool = False
    ) -> str:
        """Start an emulated process on a GPU (index or UUID) or MIG device (MIG UUID);
        `mps_client`: a client of an MPS server (nvmlDeviceGetMPSComputeRunningProcesses
        lists it; attach the server as a process of its own).

        Returns a description of where it runs. Raises SimError for a pid out of range or
        already attached, an unknown device, a full GPU with MIG enabled, or memory over what
        is free.
        """
        _check_pid(pid)
        if memory_bytes < 0:
            raise SimError(f"memory must be 0 bytes or more, not {memory_bytes}")
        if not 0.0 <= load <= 1.0:
            raise SimError(f"load must be between 0 and 1, not {load}")
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
            checkpoint_energy(state, self.health_clock())  # the load, and so the power, changes
            state.processes.append(
                ProcessState(
                    pid=pid,
                    gpu=gpu.index,
                    memory_bytes=memory_bytes,
                    gi_id=gi.id if gi else None,
                    ci_id=ci.id if ci else None,
                    load=load,
                    mps_client=mps_client,
                )
            )
        where = f"GPU {gpu.index}" + (f" GI {gi.id} CI {ci.id}" if gi and ci else "")
        return where

    def detach(self, pid: int) -> None:
        """End an emulated process. Raises SimError for a pid out of range, NothingMatched
        when no process with that pid is attached (the state file is then left as it is)."""
        _check_pid(pid)
        with self.edit() as state:
            before = len(state.processes)
            checkpoint_energy(state, self.health_clock())
            state.processes = [p for p in state.processes if p.pid != pid]
            if len(state.processes) == before:
                raise NothingMatched(f"no emulated process with pid {pid} is attached")

    def reset(self, index: int) -> None:
        """`nvidia-smi -r -i INDEX`: apply a pending MIG mode; instances do not survive; the
        health a reset restores is restored (nodeagent.sim.health.reset_health).

        Raises SimError for an unknown GPU, NvmlError IN_USE (what the driver answers) for one
        with processes on it, NOT_SUPPORTED for one whose reset the platform does not expose
        (spec suffix ':no-reset').
        """
        with self.edit() as state:
            if not 0 <= index < len(state.gpus):
                raise SimError(f"GPU {index} does not exist (this node has {len(state.gpus)})")
            pids = [str(p.pid) for p in state.processes if p.gpu == index]
            if pids:
                raise NvmlError(
                    pynvml.NVML_ERROR_IN_USE,
                    "GPU reset",
                    f"processes {', '.join(pids)} run on it",
                    context=f"GPU {index}",
                )
            gpu = state.gpus[index]
            if gpu.reset_refused:
                raise NvmlError(
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    "GPU reset",
                    "this platform does not expose a GPU reset (a pass-through VM)",
                    context=f"GPU {index}",
                )
            gpu.gis.clear()
            gpu.mig_current = gpu.mig_pending
            reset_health(gpu)

    def reboot(self) -> None:
        """The node reboots: every process ends and no MIG instance survives; a pending MIG
        mode takes effect on Ampere (its mode is kept across a reboot), while from Hopper on
        MIG mode does not survive a reboot (NVIDIA's MIG user guide)."""
        with self.edit() as state:
            checkpoint_energy(state, self.health_clock())
            state.processes.clear()
            for gpu in state.gpus:
                gpu.gis.clear()
                if load_model(gpu.model).architecture >= pynvml.NVML_DEVICE_ARCH_HOPPER:
                    gpu.mig_pending = 0
                gpu.mig_current = gpu.mig_pending
                reboot_health(gpu)

    def _find_device(self, device: str) -> tuple[GpuState, GiState | None, CiState | None]:
        gpus = self.state.gpus
        if device.isascii() and device.isdigit():
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


def _check_pid(pid: int) -> None:
    if not 1 <= pid <= MAX_PID:
        raise SimError(f"pid {pid} is not a process id (1 to {MAX_PID})")
