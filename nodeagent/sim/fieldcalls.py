"""Emulated NVML field values and engine utilizations: memory temperature, remapped rows,
NVLink and PCIe traffic counters, the driver's GPU recovery action, encoder and decoder
utilization.

What each model supports follows the hardware: an HBM sensor on every HBM board (the GDDR7 RTX
PRO 6000 has none), NVLink on the SXM/NVL boards (not on the PCIe cards and the A30); field
ids the emulator does not model answer NOT_SUPPORTED in their slot, as NVML does for a field a
GPU lacks. Values are models, not measurements: the HBM runs 6 degrees C above the GPU (HBM3
boards at idle read a few degrees warmer than the die), PCIe traffic grows with the energy
used (a busy GPU moves more data), no peer traffic on NVLink (the emulator runs no
collectives), and no video work (encoder and decoder 0 %, but NOT_SUPPORTED under MIG as the
utilization rates are).
"""

from __future__ import annotations

from typing import Any

import pynvml

from nodeagent.sim.base import _KIND_MIG, SimBase, _decode, _fail, nvml_call
from nodeagent.sim.health import energy_mj, temperature_celsius
from nodeagent.sim.state import GpuState

MEMORY_ABOVE_GPU_CELSIUS = 6
NO_HBM = frozenset({"rtx-pro-6000"})
NO_NVLINK = frozenset({"a30", "rtx-pro-6000"})  # and every "-pcie" model
PCIE_TX_BYTES_PER_MJ, PCIE_RX_BYTES_PER_MJ = 0.25, 0.5
SAMPLING_PERIOD_US = 167_000  # what the driver reports for encoder/decoder utilization
RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: nodeagent.sim.health's actions


class FieldCalls(SimBase):
    def _field(self, gpu: GpuState, field_id: int, scope_id: int) -> tuple[int, int] | None:
        """(value type, value) of one field of a whole GPU, None: not supported there."""
        ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            if gpu.model in NO_HBM:
                return None
            celsius = temperature_celsius(gpu, self._load(gpu)) + MEMORY_ABOVE_GPU_CELSIUS
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, celsius
        if field_id == RECOVERY_ACTION:  # None: a driver before R565
            action = gpu.health.recovery_action
            return None if action is None else (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, action)
        if field_id == pynvml.NVML_FI_DEV_REMAPPED_COR:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0
        if field_id == pynvml.NVML_FI_DEV_REMAPPED_UNC:  # as nvmlDeviceGetRemappedRows says
            h = gpu.health
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, h.row_remap_pending + h.row_remap_failure
        if field_id in (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ):
            if gpu.model in NO_NVLINK or "pcie" in gpu.model:
                return None
            return ull, 0
        if field_id in (
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        ):
            energy = energy_mj(gpu, self._load(gpu), self.health_clock())
            per_mj = (
                PCIE_TX_BYTES_PER_MJ
                if field_id == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
                else PCIE_RX_BYTES_PER_MJ
            )
            return ull, int(energy * per_mj)
        return None

    @nvml_call()
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        """pynvml's signature: ids, or (id, scope id) pairs; an array of c_nvmlFieldValue_t
        with each slot's own nvmlReturn. A MIG device handle answers NOT_SUPPORTED per slot
        (its counters are the GPU's)."""
        mig = _decode(handle)[0] == _KIND_MIG
        gpu = self._mig_target(handle)[0] if mig else self._gpu(handle)[0]
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(self.health_clock() * 1_000_000)
        for slot, requested in zip(values, fieldIds, strict=True):
            field_id, scope_id = requested if isinstance(requested, tuple) else (requested, 0)
            slot.fieldId, slot.scopeId, slot.timestamp = field_id, scope_id, now_us
            found = None if mig else self._field(gpu, int(field_id), int(scope_id))
            if found is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = found[0]
            if found[0] == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                slot.value.uiVal = found[1]
            else:
                slot.value.ullVal = found[1]
        return values

    def _engine(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle)[0]
        if gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [0, SAMPLING_PERIOD_US]

    @nvml_call()
    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        return self._engine(handle)

    @nvml_call()
    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        return self._engine(handle)
