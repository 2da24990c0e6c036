"""The NVML emulator: an object that stands in for the `pynvml` module.

It has pynvml's function names and signatures (the ctypes array + count-by-reference list
calls included), returns pynvml's ctypes structures and raises pynvml's `NVMLError_*`
classes, so `nodeagent.nvml` runs on it unchanged. It enforces what the hardware enforces
(see DESIGN.md, "The emulator"). Handles are ctypes pointers of pynvml's handle types whose
addresses encode (kind, gpu, gi, ci); they are never dereferenced.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from nodeagent.errors import SimError
from nodeagent.sim.faults import FaultPlan, SimulatedCrash
from nodeagent.sim.gpm import GpmSamples, gi_activity, gpu_activity
from nodeagent.sim.models import (
    INVALID_ARGUMENT_CONSTANTS,
    MIB,
    PROFILE_CONSTANT_COUNT,
    DeviceModel,
    ProfileModel,
    load_model,
)
from nodeagent.sim.state import (
    CiState,
    GiState,
    GpuState,
    ProcessState,
    SimState,
    fresh_state,
    load_state,
    save_state,
)

F = TypeVar("F", bound=Callable[..., Any])

_KIND_DEVICE, _KIND_MIG, _KIND_GI, _KIND_CI = 1, 2, 3, 4
# Compute-instance profiles: NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE constant -> N.
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
NO_ID = 0xFFFFFFFF
MAX_MIG_DEVICES = 7


def _fail(code: int) -> Any:
    raise pynvml.NVMLError(code)


def _handle(kind: int, gpu: int, gi: int = 0, ci: int = 0, ptype: Any = None) -> Any:
    addr = (kind << 40) | ((gpu + 1) << 24) | ((gi + 1) << 12) | (ci + 1)
    return ctypes.cast(ctypes.c_void_p(addr), ptype or pynvml.c_nvmlDevice_t)


def _decode(handle: Any) -> tuple[int, int, int, int]:
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[no-any-return]
    return addr >> 40, ((addr >> 24) & 0xFFFF) - 1, ((addr >> 12) & 0xFFF) - 1, (addr & 0xFFF) - 1


def _ref_value(ref: Any) -> Any:
    """The ctypes object behind byref(x) or pointer(x)."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


def nvml_call(mutating: bool = False) -> Callable[[F], F]:
    """Wrap an emulated NVML function: init check, state sync, fault injection, save."""

    def wrap(fn: F) -> F:
        name = fn.__name__

        @functools.wraps(fn)
        def inner(self: SimulatedNvml, *args: Any, **kwargs: Any) -> Any:
            # NVML is thread-safe; so is the emulator (the agent samples from threads).
            with self._lock:
                if name not in ("nvmlInit", "nvmlInitWithFlags") and not self._initialized:
                    _fail(pynvml.NVML_ERROR_UNINITIALIZED)
                fired = self.faults.on_call(name, mutating)
                for fault in fired:
                    if fault.when == "before":
                        self._fire(fault)
                with self._transaction(mutating):
                    result = fn(self, *args, **kwargs)
                for fault in fired:
                    if fault.when == "after":
                        self._fire(fault)
                return result

        return inner  # type: ignore[return-value]

    return wrap


class SimulatedNvml:
    """A drop-in for the pynvml module over emulated GPUs (see the module docstring)."""

    def __init__(
        self,
        models: list[str],
        state_path: Path | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML", "c_nvml", "nvmlFriendly", "nvmlStructTo")):
                setattr(self, name, getattr(pynvml, name))
        self.__name__ = "nodeagent.sim"
        self.faults = faults or FaultPlan()
        self._lock = threading.RLock()
        self._path = state_path
        self._stamp: tuple[int, int, int] | None = None
        self._initialized = 0
        loaded = load_state(state_path) if state_path else None
        if loaded is not None and loaded.models != models:
            raise SimError(
                f"emulator state file {state_path} holds GPUs {','.join(loaded.models)} "
                f"but the simulate spec asks for {','.join(models)}; "
                "use another --sim-state file or delete this one"
            )
        self.state = loaded or fresh_state(models)
        self._gpm = GpmSamples()
        if state_path and loaded is None:
            save_state(state_path, self.state)
        self._remember_stamp()

    # -- plumbing ---------------------------------------------------------------------------

    def _fire(self, fault: Any) -> None:
        if fault.exit_code is not None:
            if self.faults.in_process:
                raise SimulatedCrash(f"simulated kill (exit {fault.exit_code})")
            os._exit(fault.exit_code)
        _fail(fault.error)

    def _remember_stamp(self) -> None:
        if self._path is None:
            return
        try:
            st = self._path.stat()
            self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            self._stamp = None

    def _sync(self) -> None:
        """Reload the state file when another process changed it."""
        if self._path is None:
            return
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return
        if (st.st_ino, st.st_mtime_ns, st.st_size) != self._stamp:
            loaded = load_state(self._path)
            if loaded is not None:
                self.state = loaded
            self._remember_stamp()

    @contextmanager
    def _transaction(self, mutating: bool) -> Iterator[None]:
        if self._path is None:
            yield
            return
        if not mutating:
            self._sync()
            yield
            return
        lock_path = self._path.with_name(self._path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._sync()
            yield
            save_state(self._path, self.state)
            self._remember_stamp()

    @contextmanager
    def edit(self) -> Iterator[SimState]:
        """Change the state outside NVML (attach a process, reset a GPU), persisted atomically."""
        with self._lock, self._transaction(True):
            yield self.state

    def _gpu(self, handle: Any, allow_mig: bool = False) -> tuple[GpuState, DeviceModel]:
        kind, gpu, _, _ = _decode(handle)
        if kind not in (_KIND_DEVICE, _KIND_MIG) or (kind == _KIND_MIG and not allow_mig):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= gpu < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state = self.state.gpus[gpu]
        return state, load_model(state.model)

    def _mig_on(self, gpu: GpuState) -> None:
        if not gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _gi(self, handle: Any) -> tuple[GpuState, DeviceModel, GiState]:
        kind, gpu_index, gi_id, _ = _decode(handle)
        if kind != _KIND_GI or not 0 <= gpu_index < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.state.gpus[gpu_index]
        self._mig_on(gpu)
        gi = gpu.gis.get(gi_id)
        if gi is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None
        return gpu, load_model(gpu.model), gi

    def _ci(self, handle: Any) -> tuple[GpuState, GiState, CiState]:
        kind, gpu_index, gi_id, ci_id = _decode(handle)
        if kind != _KIND_CI or not 0 <= gpu_index < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.state.gpus[gpu_index]
        self._mig_on(gpu)
        gi = gpu.gis.get(gi_id)
        ci = gi.cis.get(ci_id) if gi else None
        if gi is None or ci is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None and ci is not None
        return gpu, gi, ci

    def _mig_devices(self, gpu: GpuState) -> list[tuple[GiState, CiState]]:
        return [(gi, gi.cis[c]) for g, gi in sorted(gpu.gis.items()) for c in sorted(gi.cis)]

    def _mig_target(self, handle: Any) -> tuple[GpuState, DeviceModel, GiState, CiState]:
        kind, _gpu_index, gi_id, ci_id = _decode(handle)
        if kind != _KIND_MIG:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, model = self._gpu(handle, allow_mig=True)
        gi = gpu.gis.get(gi_id)
        ci = gi.cis.get(ci_id) if gi else None
        if gi is None or ci is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None and ci is not None
        return gpu, model, gi, ci

    def _processes_on(self, gpu: int, gi: int | None = None, ci: int | None = None) -> list[Any]:
        return [
            p
            for p in self.state.processes
            if p.gpu == gpu and (gi is None or p.gi_id == gi) and (ci is None or p.ci_id == ci)
        ]

    def _profile(self, model: DeviceModel, profile_id: int) -> ProfileModel:
        profile = model.profile_by_id(profile_id)
        if profile is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert profile is not None
        return profile

    # -- library, system --------------------------------------------------------------------

    @nvml_call()
    def nvmlInit(self) -> None:
        self._initialized += 1

    @nvml_call()
    def nvmlInitWithFlags(self, flags: int) -> None:
        self._initialized += 1

    @nvml_call()
    def nvmlShutdown(self) -> None:
        self._initialized -= 1

    def nvmlErrorString(self, result: int) -> str:
        return str(pynvml.NVMLError(result))

    @nvml_call()
    def nvmlSystemGetDriverVersion(self) -> str:
        return load_model(self.state.gpus[0].model).driver_version if self.state.gpus else ""

    @nvml_call()
    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13." + self.nvmlSystemGetDriverVersion()

    @nvml_call()
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return load_model(self.state.gpus[0].model).cuda_driver_version if self.state.gpus else 0

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    # -- devices ----------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.state.gpus)

    @nvml_call()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _handle(_KIND_DEVICE, index)

    @nvml_call()
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.state.gpus:
            if gpu.uuid == text:
                return _handle(_KIND_DEVICE, gpu.index)
            for gi, ci in self._mig_devices(gpu):
                if ci.uuid == text:
                    return _handle(_KIND_MIG, gpu.index, gi.id, ci.id)
        return _fail(pynvml.NVML_ERROR_NOT_FOUND)

    @nvml_call()
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle)[0].index

    @nvml_call()
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if _decode(handle)[0] == _KIND_MIG:
            return self._mig_target(handle)[3].uuid
        return self._gpu(handle)[0].uuid

    @nvml_call()
    def nvmlDeviceGetName(self, handle: Any) -> str:
        if _decode(handle)[0] == _KIND_MIG:
            _gpu, model, gi, _ = self._mig_target(handle)
            return f"{model.name} {self._profile(model, gi.profile_id).name}"
        return self._gpu(handle)[1].name

    @nvml_call()
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu, model = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        info.domain = 0
        info.bus = int(gpu.pci_bus_id.split(":")[1], 16)
        info.device = 0
        info.pciDeviceId = model.pci_device_id
        info.pciSubSystemId = 0x18C810DE
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def _memory(self, handle: Any) -> tuple[int, int]:
        """(total, used) bytes of a GPU or MIG device."""
        if _decode(handle)[0] == _KIND_MIG:
            gpu, model, gi, ci = self._mig_target(handle)
            total = self._profile(model, gi.profile_id).memory_size_mb * MIB
            used = sum(p.memory_bytes for p in self._processes_on(gpu.index, gi.id, ci.id))
            return total, used
        gpu, model = self._gpu(handle)
        used = model.memory_reserved_bytes + sum(
            p.memory_bytes for p in self._processes_on(gpu.index)
        )
        return model.memory_total_bytes, used

    @nvml_call()
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        mem = pynvml.c_nvmlMemory_t()
        total, used = self._memory(handle)
        mem.total, mem.used, mem.free = total, used, max(total - used, 0)
        return mem

    @nvml_call()
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle, allow_mig=True)[1].compute_capability

    @nvml_call()
    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return self._gpu(handle, allow_mig=True)[1].architecture

    @nvml_call()
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if _decode(handle)[0] == _KIND_MIG:
            gpu, _, gi, ci = self._mig_target(handle)
            procs = self._processes_on(gpu.index, gi.id, ci.id)
        else:
            procs = self._processes_on(self._gpu(handle)[0].index)
        out = []
        for p in procs:
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory = p.pid, p.memory_bytes
            info.gpuInstanceId = NO_ID if p.gi_id is None else p.gi_id
            info.computeInstanceId = NO_ID if p.ci_id is None else p.ci_id
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    @nvml_call()
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu, _ = self._gpu(handle)
        if gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        rates = pynvml.c_nvmlUtilization_t()
        load = min(sum(p.load for p in self._processes_on(gpu.index)), 1.0)
        rates.gpu, rates.memory = round(load * 100), round(load * 22)
        return rates

    @nvml_call()
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._gpu(handle)[0].compute_mode

    @nvml_call(mutating=True)
    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        gpu, _ = self._gpu(handle)
        if mode not in (0, 2, 3):  # DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode

    # -- MIG mode ---------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu, _ = self._gpu(handle)
        return [gpu.mig_current, gpu.mig_pending]

    @nvml_call(mutating=True)
    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Hopper+: takes effect at once unless processes run (then pending, status IN_USE).
        Ampere: stays pending until the GPU is reset (status RESET_REQUIRED)."""
        gpu, model = self._gpu(handle)
        if mode not in (0, 1):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if mode == 0 and gpu.gis:
            _fail(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_pending = mode
        if mode == gpu.mig_current:
            return int(pynvml.NVML_SUCCESS)
        if model.architecture < pynvml.NVML_DEVICE_ARCH_HOPPER:
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)
        if self._processes_on(gpu.index):
            return int(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_current = mode
        return int(pynvml.NVML_SUCCESS)

    # -- GPU instances ----------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> Any:
        _, model = self._gpu(handle)
        if not 0 <= profile < PROFILE_CONSTANT_COUNT or profile in INVALID_ARGUMENT_CONSTANTS:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        p = model.profile_by_constant(profile)
        if p is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert p is not None
        return self._profile_info(p)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    @nvml_call()
    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profileId: int) -> Any:
        return self._profile_info(self._profile(self._gpu(handle)[1], profileId))

    @staticmethod
    def _profile_info(p: ProfileModel) -> Any:
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
        info.id, info.isP2pSupported, info.sliceCount = p.id, p.is_p2p_supported, p.slice_count
        info.instanceCount, info.multiprocessorCount = p.instance_count, p.multiprocessor_count
        info.copyEngineCount, info.decoderCount = p.copy_engine_count, p.decoder_count
        info.encoderCount, info.jpegCount, info.ofaCount = (
            p.encoder_count,
            p.jpeg_count,
            p.ofa_count,
        )
        info.memorySizeMB, info.name = p.memory_size_mb, p.name.encode()
        return info

    def _conflict(self, gpu: GpuState, model: DeviceModel, p: ProfileModel, start: int) -> bool:
        """Would a GI of profile p at `start` break a hardware rule on this GPU?"""
        size = next(n for s, n in p.placements if s == start)
        taken = {s for gi in gpu.gis.values() for s in range(gi.start, gi.start + gi.size)}
        if taken & set(range(start, start + size)):
            return True
        same = [gi for gi in gpu.gis.values() if gi.profile_id == p.id]
        if len(same) >= p.instance_count:
            return True
        profiles = [self._profile(model, gi.profile_id) for gi in gpu.gis.values()]
        if p.name.endswith("+me") and any(q.name.endswith("+me") for q in profiles):
            return True
        used = sum(q.slice_count for q in profiles)
        return used + p.slice_count > model.compute_slices

    @nvml_call()
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profileId: int) -> int:
        gpu, model = self._gpu(handle)
        p = self._profile(model, profileId)
        # Greedy count of how many more fit, trying placements in order.
        trial = GpuState(gpu.index, gpu.model, gpu.uuid, gpu.pci_bus_id, gis=dict(gpu.gis))
        count = 0
        for start, size in p.placements:
            if not self._conflict(trial, model, p, start):
                trial.gis[-1 - count] = GiState(-1 - count, p.id, start, size)
                count += 1
        return count

    @nvml_call()
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        _, model = self._gpu(handle)
        p = self._profile(model, profileId)
        count = _ref_value(countRef)
        if placementsRef is None:
            count.value = len(p.placements)
            return int(pynvml.NVML_SUCCESS)
        if len(placementsRef) < len(p.placements):
            count.value = len(p.placements)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (start, size) in enumerate(p.placements):
            placementsRef[i].start, placementsRef[i].size = start, size
        count.value = len(p.placements)
        return int(pynvml.NVML_SUCCESS)

    def _create_gi(self, gpu: GpuState, model: DeviceModel, p: ProfileModel, start: int) -> Any:
        size = next(n for s, n in p.placements if s == start)
        gi_id = next(i for i in range(1, 64) if i not in gpu.gis)
        gpu.gis[gi_id] = GiState(gi_id, p.id, start, size)
        return _handle(_KIND_GI, gpu.index, gi_id, ptype=pynvml.c_nvmlGpuInstance_t)

    @nvml_call(mutating=True)
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profileId: int, placement: Any
    ) -> Any:
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        placement = _ref_value(placement)
        if (placement.start, placement.size) not in p.placements:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._conflict(gpu, model, p, placement.start):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_gi(gpu, model, p, placement.start)

    @nvml_call(mutating=True)
    def nvmlDeviceCreateGpuInstance(self, handle: Any, profileId: int) -> Any:
        """Without a placement the first free one is taken: order-dependent, as on hardware."""
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        for start, _ in p.placements:
            if not self._conflict(gpu, model, p, start):
                return self._create_gi(gpu, model, p, start)
        return _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    @nvml_call()
    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        found = [gi for _, gi in sorted(gpu.gis.items()) if gi.profile_id == p.id]
        count = _ref_value(countRef)
        if gpuInstancesRef is None or len(gpuInstancesRef) < len(found):
            count.value = len(found)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = _handle(
                _KIND_GI, gpu.index, gi.id, ptype=pynvml.c_nvmlGpuInstance_t
            )
        count.value = len(found)
        return int(pynvml.NVML_SUCCESS)

    @nvml_call()
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpuInstanceId: int) -> Any:
        gpu, _ = self._gpu(handle)
        self._mig_on(gpu)
        if gpuInstanceId not in gpu.gis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _handle(_KIND_GI, gpu.index, gpuInstanceId, ptype=pynvml.c_nvmlGpuInstance_t)

    @nvml_call()
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gpu, _, gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = _handle(_KIND_DEVICE, gpu.index)
        info.id, info.profileId = gi.id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    @nvml_call(mutating=True)
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gpu, _, gi = self._gi(gpuInstance)
        if gi.cis or self._processes_on(gpu.index, gi.id):
            _fail(pynvml.NVML_ERROR_IN_USE)
        del gpu.gis[gi.id]
        return int(pynvml.NVML_SUCCESS)

    # -- compute instances ------------------------------------------------------------------

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        _, model, gi = self._gi(gpuInstance)
        gi_profile = self._profile(model, gi.profile_id)
        slices = _CI_SLICES.get(profile)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if slices is None or slices > gi_profile.slice_count:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert slices is not None
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.version = pynvml.nvmlComputeInstanceProfileInfo_v2
        info.id, info.sliceCount = profile, slices
        info.instanceCount = gi_profile.slice_count // slices
        info.multiprocessorCount = (
            gi_profile.multiprocessor_count * slices // gi_profile.slice_count
        )
        info.sharedCopyEngineCount = gi_profile.copy_engine_count
        info.sharedDecoderCount = gi_profile.decoder_count
        info.sharedEncoderCount = gi_profile.encoder_count
        info.sharedJpegCount = gi_profile.jpeg_count
        info.sharedOfaCount = gi_profile.ofa_count
        short = gi_profile.name.removeprefix("MIG ")
        info.name = (short if slices == gi_profile.slice_count else f"{slices}c.{short}").encode()
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def _ci_slices_used(self, model: DeviceModel, gi: GiState) -> int:
        return sum(_CI_SLICES[ci.profile_id] for ci in gi.cis.values())

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        _, model, gi = self._gi(gpuInstance)
        total = self._profile(model, gi.profile_id).slice_count
        slices = _CI_SLICES.get(profileId)
        if slices is None or slices > total:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert slices is not None
        return (total - self._ci_slices_used(model, gi)) // slices

    @nvml_call(mutating=True)
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gpu, model, gi = self._gi(gpuInstance)
        total = self._profile(model, gi.profile_id).slice_count
        slices = _CI_SLICES.get(profileId)
        if slices is None or slices > total:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert slices is not None
        if self._ci_slices_used(model, gi) + slices > total:
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(0, 16) if i not in gi.cis)
        gi.cis[ci_id] = CiState(ci_id, profileId, gpu.new_mig_uuid())
        return _handle(_KIND_CI, gpu.index, gi.id, ci_id, ptype=pynvml.c_nvmlComputeInstance_t)

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gpu, _, gi = self._gi(gpuInstance)
        found = [ci for _, ci in sorted(gi.cis.items()) if ci.profile_id == profileId]
        count = _ref_value(countRef)
        if computeInstancesRef is None or len(computeInstancesRef) < len(found):
            count.value = len(found)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, ci in enumerate(found):
            computeInstancesRef[i] = _handle(
                _KIND_CI, gpu.index, gi.id, ci.id, ptype=pynvml.c_nvmlComputeInstance_t
            )
        count.value = len(found)
        return int(pynvml.NVML_SUCCESS)

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        gpu, _, gi = self._gi(gpuInstance)
        if computeInstanceId not in gi.cis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _handle(
            _KIND_CI, gpu.index, gi.id, computeInstanceId, ptype=pynvml.c_nvmlComputeInstance_t
        )

    @nvml_call()
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        gpu, gi, ci = self._ci(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = _handle(_KIND_DEVICE, gpu.index)
        info.gpuInstance = _handle(_KIND_GI, gpu.index, gi.id, ptype=pynvml.c_nvmlGpuInstance_t)
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = 0, _CI_SLICES[ci.profile_id]
        return info

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    @nvml_call(mutating=True)
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        gpu, gi, ci = self._ci(computeInstance)
        if self._processes_on(gpu.index, gi.id, ci.id):
            _fail(pynvml.NVML_ERROR_IN_USE)
        del gi.cis[ci.id]
        return int(pynvml.NVML_SUCCESS)

    # -- MIG devices ------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu, _ = self._gpu(handle)
        return MAX_MIG_DEVICES if gpu.mig_current else 0

    @nvml_call()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu, _ = self._gpu(handle)
        self._mig_on(gpu)
        if not 0 <= index < MAX_MIG_DEVICES:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = devices[index]
        return _handle(_KIND_MIG, gpu.index, gi.id, ci.id)

    @nvml_call()
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        return ctypes.c_uint(1 if _decode(handle)[0] == _KIND_MIG else 0)

    @nvml_call()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu, _, _, _ = self._mig_target(migDevice)
        return _handle(_KIND_DEVICE, gpu.index)

    @nvml_call()
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_target(handle)[2].id

    @nvml_call()
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_target(handle)[3].id

    @nvml_call()
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        """MIG devices only; a full GPU answers NOT_SUPPORTED (seen on the real H200)."""
        if _decode(handle)[0] != _KIND_MIG:
            self._gpu(handle)
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _, model, gi, ci = self._mig_target(handle)
        p = self._profile(model, gi.profile_id)
        slices = _CI_SLICES[ci.profile_id]
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = p.multiprocessor_count * slices // p.slice_count
        attrs.sharedCopyEngineCount, attrs.sharedDecoderCount = p.copy_engine_count, p.decoder_count
        attrs.sharedEncoderCount, attrs.sharedJpegCount = p.encoder_count, p.jpeg_count
        attrs.sharedOfaCount = p.ofa_count
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = p.slice_count, slices
        attrs.memorySizeMB = p.memory_size_mb
        return attrs

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    # -- GPM --------------------------------------------------------------------------------

    @nvml_call()
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        _, model = self._gpu(device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(model.gpm_supported)
        return support

    @nvml_call()
    def nvmlGpmSampleAlloc(self) -> Any:
        return self._gpm.alloc()

    @nvml_call()
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gpm.free(gpmSample)

    @nvml_call()
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu, model = self._gpu(device)
        if not model.gpm_supported:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm.record(gpmSample, gpu_activity(self.state, gpu))
        return gpmSample

    @nvml_call()
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu, model = self._gpu(device)
        if not model.gpm_supported:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._mig_on(gpu)
        if gpuInstanceId not in gpu.gis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        self._gpm.record(gpmSample, gi_activity(self.state, gpu.index, gpuInstanceId))
        return gpmSample

    @nvml_call()
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        return self._gpm.metrics(metricsGet)

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
