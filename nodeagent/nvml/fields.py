"""Device counters read through NVML field values: memory temperature, remapped rows, NVLink
and PCIe traffic; with them the encoder, decoder and memory-copy utilization and the reserved
framebuffer, which NVML has no field for.

One `nvmlDeviceGetFieldValues` call per GPU carries every field the GPU answered before;
a field the GPU answers NOT_SUPPORTED (per model: no HBM sensor, no NVLink) is left out of
the next calls, as the health reads do. Every value NVML does not give is None, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeagent.nvml.codes import FUNCTION_NOT_FOUND, INVALID_ARGUMENT, NOT_SUPPORTED
from nodeagent.nvml.session import NvmlSession

_ABSENT = (NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND)
ALL_LINKS = 0xFFFFFFFF  # scopeId: the sum over every NVLink of the GPU
KIB = 1024
MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver asks to be done to the GPU (an
# nvmlDeviceGpuRecoveryAction_t), from the R565 driver on. The number, not pynvml's name, so
# an older nvidia-ml-py reads it too.
RECOVERY_ACTION = 230

# NVML_FI_* ids, by the attribute of DeviceFields they fill.
FIELDS: tuple[tuple[str, int, int], ...] = (  # (name, field id, scope id)
    ("memory_temperature_celsius", 82, 0),  # NVML_FI_DEV_MEMORY_TEMP
    ("remapped_rows_correctable", 142, 0),  # NVML_FI_DEV_REMAPPED_COR
    ("remapped_rows_uncorrectable", 143, 0),  # NVML_FI_DEV_REMAPPED_UNC
    ("nvlink_tx_kib", 140, ALL_LINKS),  # NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX (with headers)
    ("nvlink_rx_kib", 141, ALL_LINKS),  # NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX
    ("pcie_tx_bytes", 197, 0),  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    ("pcie_rx_bytes", 198, 0),  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
)
# nvmlValueType_t -> the member of c_nvmlValue_t holding the value
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


@dataclass(frozen=True)
class DeviceFields:
    """One read of a GPU's field-value counters and engine utilizations; None: NVML does not
    give it on this GPU (or under MIG, where the utilizations are not reported)."""

    memory_temperature_celsius: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    nvlink_tx_bytes: int | None = None  # since the driver loaded, protocol headers included
    nvlink_rx_bytes: int | None = None
    pcie_tx_bytes: int | None = None  # since the driver loaded
    pcie_rx_bytes: int | None = None
    encoder_utilization: float | None = None  # 0-1
    decoder_utilization: float | None = None  # 0-1
    memory_reserved_bytes: int | None = None


def read_recovery_action(
    session: NvmlSession, handle: Any, unsupported: set[tuple[Any, ...]] | None = None
) -> int | None:
    """The GPU's recovery action (0 NONE, 1 GPU_RESET, 2 NODE_REBOOT, 3 DRAIN_P2P,
    4 DRAIN_AND_RESET, ...: nodeagent.state.recovery), None where the driver or the device does
    not report it (remembered in `unsupported`: not asked again) or the read failed this time.
    nvidia-smi equivalent: `nvidia-smi -q` "Recovery Action". Raises NvmlError only for a
    failure of the call other than "not supported" (the GPU or NVML gone among them)."""
    key = ("nvmlDeviceGetFieldValues", RECOVERY_ACTION)
    if unsupported is not None and key in unsupported:
        return None
    request = [(RECOVERY_ACTION, 0)]
    answer = session.call("nvmlDeviceGetFieldValues", handle, request, absent=_ABSENT)
    code = None if answer is None else int(answer[0].nvmlReturn)
    if code is None or code in _ABSENT:
        if unsupported is not None:
            unsupported.add(key)
        return None
    if code != 0:
        return None  # this time only (the value is the driver's to give next time)
    slot = answer[0]
    kind = int(slot.valueType)
    return int(getattr(slot.value, _MEMBERS[kind])) if 0 <= kind < len(_MEMBERS) else None


class FieldReader:
    """Reads DeviceFields per GPU index; keeps what each GPU does not support (fixed while
    NVML is loaded) and the reserved framebuffer (fixed too: read once)."""

    def __init__(self, session: NvmlSession) -> None:
        self.session = session
        self._unsupported: dict[int, set[str]] = {}
        self._reserved: dict[int, int | None] = {}

    def read(self, index: int, handle: Any, mig_enabled: bool) -> DeviceFields:
        """Every counter of GPU `index` (`handle` its device handle). nvidia-smi equivalent:
        `nvidia-smi -q -d TEMPERATURE,UTILIZATION,MEMORY,ROW_REMAPPER`, `nvidia-smi nvlink -gt d`.
        Raises NvmlError for a failure other than "not supported"."""
        skip = self._unsupported.setdefault(index, set())
        values = self._field_values(handle, skip)
        if index not in self._reserved:
            self._reserved[index] = self._reserved_bytes(handle)
        encoder = decoder = None
        if not mig_enabled:  # NVML reports engine utilization for whole GPUs only
            encoder = self._utilization("nvmlDeviceGetEncoderUtilization", handle, skip)
            decoder = self._utilization("nvmlDeviceGetDecoderUtilization", handle, skip)
        tx, rx = values.get("nvlink_tx_kib"), values.get("nvlink_rx_kib")
        temperature = values.get("memory_temperature_celsius")
        return DeviceFields(
            memory_temperature_celsius=None if temperature is None else int(temperature),
            remapped_rows_correctable=values.get("remapped_rows_correctable"),
            remapped_rows_uncorrectable=values.get("remapped_rows_uncorrectable"),
            nvlink_tx_bytes=None if tx is None else tx * KIB,
            nvlink_rx_bytes=None if rx is None else rx * KIB,
            pcie_tx_bytes=values.get("pcie_tx_bytes"),
            pcie_rx_bytes=values.get("pcie_rx_bytes"),
            encoder_utilization=encoder,
            decoder_utilization=decoder,
            memory_reserved_bytes=self._reserved[index],
        )

    def _field_values(self, handle: Any, skip: set[str]) -> dict[str, int]:
        wanted = [f for f in FIELDS if f[0] not in skip]
        if not wanted:
            return {}
        request = [(field_id, scope) for _, field_id, scope in wanted]
        answer = self.session.call("nvmlDeviceGetFieldValues", handle, request, absent=_ABSENT)
        if answer is None:  # a driver without field values: none of them, ever
            skip.update(f[0] for f in FIELDS)
            return {}
        values: dict[str, int] = {}
        for (name, _, _), slot in zip(wanted, answer, strict=True):
            if int(slot.nvmlReturn) != 0:
                if int(slot.nvmlReturn) in _ABSENT:
                    skip.add(name)
                continue
            values[name] = int(getattr(slot.value, _MEMBERS[int(slot.valueType)]))
        return values

    def _utilization(self, function: str, handle: Any, skip: set[str]) -> float | None:
        if function in skip:
            return None
        answer = self.session.call(function, handle, absent=_ABSENT)
        if answer is None:
            skip.add(function)
            return None
        return int(answer[0]) / 100.0

    def _reserved_bytes(self, handle: Any) -> int | None:
        """nvmlDeviceGetMemoryInfo_v2's reserved memory (driver and firmware)."""
        memory = self.session.call("nvmlDeviceGetMemoryInfo", handle, MEMORY_V2, absent=_ABSENT)
        return None if memory is None else int(memory.reserved)
