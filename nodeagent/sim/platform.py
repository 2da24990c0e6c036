"""Emulated reads of what the node is part of: the NVLink fabric (NVML) and a vGPU's PCI
config space (sysfs, where GPU Feature Discovery reads the vGPU host driver).

The fabric comes from the device model's `fabric` (the GB200 model carries the one a real
GB200 reported); other models answer NOT_SUPPORTED, as the H200 does. The config space is not
NVML: `pci_config_space` stands in for `/sys/bus/pci/devices/<bus id>/config`, and answers
only for a GPU given one with `set_pci_config_space` (a test loads GFD's recorded vGPU
config space); for the others it answers None (unreadable), so nothing is said of vGPUs.
"""

from __future__ import annotations

import uuid
from typing import Any

import pynvml

from nodeagent.sim.base import SimBase, _fail, _ref_value, nvml_call


class PlatformCalls(SimBase):
    _pci_config: dict[str, bytes]

    @nvml_call()
    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, c_info: Any) -> int:
        """Fills the caller's c_nvmlGpuFabricInfo_t; NOT_SUPPORTED for a model without one."""
        _, model = self._gpu(handle)
        if model.fabric is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert model.fabric is not None
        state, status, cluster, clique = model.fabric
        info = _ref_value(c_info)
        info.state, info.status, info.cliqueId = state, status, clique
        for i, byte in enumerate(uuid.UUID(cluster).bytes):
            info.clusterUuid[i] = byte
        return int(pynvml.NVML_SUCCESS)

    def set_pci_config_space(self, index: int, data: bytes) -> None:
        """Give GPU `index` this PCI config space (kept in memory, this process only)."""
        if not hasattr(self, "_pci_config"):
            self._pci_config = {}
        self._pci_config[self.state.gpus[index].pci_bus_id.lower()] = bytes(data)

    def pci_config_space(self, bus_id: str) -> bytes | None:
        """The config space given to the GPU at `bus_id` (NVML's form), or None."""
        return getattr(self, "_pci_config", {}).get(bus_id.lower())
