"""Emulated NVML calls: library, system, devices, MIG mode."""

from __future__ import annotations

from typing import Any

import pynvml

from nodeagent.sim.base import (
    _KIND_DEVICE,
    _KIND_MIG,
    NO_ID,
    SimBase,
    _decode,
    _fail,
    _handle,
    _ref_value,
    nvml_call,
)
from nodeagent.sim.models import (
    load_model,
)
from nodeagent.sim.rules import COMPUTE_MODES, device_memory

PCI_CLASS_3D_CONTROLLER = 0x030200
_PCI_SUBSYSTEM_ID = 0x18C810DE


class DeviceCalls(SimBase):
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
        address = self._derived("by-uuid", self._uuids).get(text)
        if address is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _handle(*address)

    def _uuids(self) -> dict[str, tuple[int, ...]]:
        """Every GPU's and MIG device's UUID -> its handle's (kind, gpu, gi, ci)."""
        found: dict[str, tuple[int, ...]] = {}
        for gpu in self.state.gpus:
            found.setdefault(gpu.uuid, (_KIND_DEVICE, gpu.index))
            for gi, ci in self._mig_devices(gpu):
                found.setdefault(ci.uuid, (_KIND_MIG, gpu.index, gi.id, ci.id))
        return found

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
        info.pciSubSystemId = _PCI_SUBSYSTEM_ID
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    # pynvml's names for the extended PCI info start in lower case: SimBase does not copy them.
    nvmlPciInfoExt_v1_t = pynvml.nvmlPciInfoExt_v1_t
    nvmlPciInfoExt_v1 = pynvml.nvmlPciInfoExt_v1

    @nvml_call()
    def nvmlDeviceGetPciInfoExt(self, handle: Any, c_info: Any) -> None:
        """Fills the caller's nvmlPciInfoExt_v1_t (passed by reference, version set).

        Every emulated model is a data-centre board that comes up as a 3D controller (PCI class
        0x0302, as `lspci -n` shows for A100, H100, H200 and A30): the class GPU Feature
        Discovery turns into `gpu.mode=compute`."""
        gpu, model = self._gpu(handle)
        info = _ref_value(c_info)
        if int(info.version) != pynvml.nvmlPciInfoExt_v1:
            _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.domain, info.bus, info.device = 0, int(gpu.pci_bus_id.split(":")[1], 16), 0
        info.pciDeviceId, info.pciSubSystemId = model.pci_device_id, _PCI_SUBSYSTEM_ID
        info.baseClass = PCI_CLASS_3D_CONTROLLER >> 16
        info.subClass = PCI_CLASS_3D_CONTROLLER >> 8 & 0xFF
        info.busId = gpu.pci_bus_id.encode()

    @nvml_call()
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        """Version 1 counts the reserved memory as used; version 2 (nvmlMemory_v2) reports it
        apart, as the driver does."""
        total, used = self._memory(handle)
        if not version:
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used, max(total - used, 0)
            return mem
        if version != pynvml.nvmlMemory_v2:
            _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        reserved = self._reserved(handle)
        mem2 = pynvml.c_nvmlMemory_v2_t()
        mem2.version, mem2.total, mem2.reserved = version, total, reserved
        mem2.used, mem2.free = used - reserved, max(total - used, 0)
        return mem2

    def _reserved(self, handle: Any) -> int:
        if _decode(handle)[0] == _KIND_MIG:
            _, model, gi, _ = self._mig_target(handle)
            return device_memory(model, self._profile(model, gi.profile_id))[1]
        return device_memory(self._gpu(handle)[1], None)[1]

    @nvml_call()
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle, allow_mig=True)[1].compute_capability

    @nvml_call()
    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return self._gpu(handle, allow_mig=True)[1].architecture

    @nvml_call()
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._process_infos(self._device_processes(handle))

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    @nvml_call()
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        # The clients only, as a real H200 lists them; the server is in the compute list.
        return self._process_infos([p for p in self._device_processes(handle) if p.mps_client])

    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses

    def _device_processes(self, handle: Any) -> list[Any]:
        if _decode(handle)[0] == _KIND_MIG:
            gpu, _, gi, ci = self._mig_target(handle)
            return self._processes_on(gpu.index, gi.id, ci.id)
        return self._processes_on(self._gpu(handle)[0].index)

    @staticmethod
    def _process_infos(procs: list[Any]) -> list[Any]:
        out = []
        for p in procs:
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory = p.pid, p.memory_bytes
            info.gpuInstanceId = NO_ID if p.gi_id is None else p.gi_id
            info.computeInstanceId = NO_ID if p.ci_id is None else p.ci_id
            out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

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
        if mode not in COMPUTE_MODES:
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
