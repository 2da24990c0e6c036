"""Emulated NVML calls: health counters and XID event sets; and `sim health` / `sim xid`.

A MIG device handle answers NOT_SUPPORTED for the device-wide reads (temperature, power,
clocks, energy, clock-event reasons, row remapping, PCIe replays). ECC follows NVML's note on
MIG-enabled GPUs: the GPU's volatile counts are not supported, a MIG device reports its
uncorrected volatile count only (the emulator puts no error on a MIG device: 0).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import pynvml

from nodeagent.base.errors import SimError
from nodeagent.sim.base import (
    _KIND_DEVICE,
    _KIND_MIG,
    NO_ID,
    SimBase,
    _decode,
    _fail,
    _handle,
    nvml_call,
)
from nodeagent.sim.health import (
    MAX_TEMPERATURE,
    MAX_WATTS,
    REASON_NAMES,
    RECOVERY_ACTIONS,
    U32_MAX,
    U64_MAX,
    add_errors,
    checkpoint_energy,
    energy_mj,
    health_model,
    memory_clock_mhz,
    power_watts,
    record_xid,
    sm_clock_mhz,
    temperature_celsius,
    throttle_mask,
    volatile_ecc,
    xid_after,
)
from nodeagent.sim.state import GpuState

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError: the only event type the emulator sends
_EVENT_SET_KIND = 6
MAX_XID = 2**32 - 1
MAX_COUNT = 1_000_000
COUNTER_MAX = {"ecc_corrected": U64_MAX, "ecc_uncorrected": U64_MAX, "pcie_replays": U32_MAX}


class HealthCalls(SimBase):
    _event_serial = itertools.count(1)
    _xid_sets: dict[int, dict[int, int]]

    def _physical(self, handle: Any) -> GpuState:
        """The GPU behind a device handle; a MIG device handle answers NOT_SUPPORTED."""
        if _decode(handle)[0] == _KIND_MIG:
            self._mig_target(handle)  # NOT_FOUND for a MIG device that no longer exists
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(handle)[0]

    # -- reads ------------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._physical(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return temperature_celsius(gpu, self._load(gpu))

    @nvml_call()
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._physical(handle)
        return round(power_watts(gpu, self._load(gpu)) * 1000)

    @nvml_call()
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return round(health_model(self._physical(handle).model).limit_watts * 1000)

    @nvml_call()
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._physical(handle)
        return energy_mj(gpu, self._load(gpu), self.health_clock())

    @nvml_call()
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._physical(handle)
        if clock == pynvml.NVML_CLOCK_SM or clock == pynvml.NVML_CLOCK_GRAPHICS:
            return sm_clock_mhz(gpu, self._load(gpu))
        if clock == pynvml.NVML_CLOCK_MEM:
            return memory_clock_mhz(gpu)
        return _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[no-any-return]

    @nvml_call()
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._physical(handle)
        return throttle_mask(gpu, self._load(gpu))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    @nvml_call()
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        if errorType not in (0, 1) or counterType not in (0, 1):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        uncorrected = errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = counterType == pynvml.NVML_VOLATILE_ECC
        if _decode(handle)[0] == _KIND_MIG:
            self._mig_target(handle)
            if not (uncorrected and volatile):
                _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return 0
        gpu = self._gpu(handle)[0]
        if volatile and gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if volatile:
            return volatile_ecc(gpu, uncorrected)
        return gpu.health.ecc_uncorrected if uncorrected else gpu.health.ecc_corrected

    @nvml_call()
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._physical(handle)
        h = gpu.health
        # Rows remapped for corrected / uncorrected errors: one per pending or failed remap.
        return (
            0,
            h.row_remap_pending + h.row_remap_failure,
            h.row_remap_pending,
            h.row_remap_failure,
        )

    @nvml_call()
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._physical(handle).health.pcie_replays

    # -- events -----------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._physical(handle)
        return XID_EVENT

    @nvml_call()
    def nvmlEventSetCreate(self) -> Any:
        addr = (_EVENT_SET_KIND << 40) | next(self._event_serial)
        self._event_sets()[addr] = {}
        return ctypes.cast(ctypes.c_void_p(addr), pynvml.c_nvmlEventSet_t)

    @nvml_call()
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        if _decode(handle)[0] != _KIND_DEVICE:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpu(handle)[0]
        seen = self._event_set(eventSet)
        if eventTypes & ~XID_EVENT:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # A set receives only the events after its registration.
        seen.setdefault(gpu.index, gpu.health.xid_serial)

    @nvml_call()
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        """The oldest XID not yet delivered to this set; TIMEOUT at once when there is none
        (the emulator never blocks: its callers poll)."""
        seen = self._event_set(eventSet)
        for index in sorted(seen):
            found = xid_after(self.state.gpus[index], seen[index])
            if found is None:
                continue
            seen[index] = found[0]
            data = pynvml.c_nvmlEventData_t()
            data.device = _handle(_KIND_DEVICE, index)
            data.eventType, data.eventData = XID_EVENT, found[1]
            gi = self.state.gpus[index].gis.get(found[2]) if found[2] is not None else None
            # A GPU instance's XID names it and its first compute instance (NVML's gpuInstanceId,
            # computeInstanceId); one whose GI went since names neither.
            data.gpuInstanceId = NO_ID if gi is None else gi.id
            data.computeInstanceId = NO_ID if gi is None or not gi.cis else min(gi.cis)
            return data
        return _fail(pynvml.NVML_ERROR_TIMEOUT)

    nvmlEventSetWait = nvmlEventSetWait_v2

    @nvml_call()
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_set(eventSet)
        del self._event_sets()[ctypes.cast(eventSet, ctypes.c_void_p).value or 0]

    def _event_sets(self) -> dict[int, dict[int, int]]:
        """Event sets of this process: address -> {gpu index: last serial delivered}."""
        if not hasattr(self, "_xid_sets"):
            self._xid_sets = {}
        return self._xid_sets

    def _event_set(self, eventSet: Any) -> dict[int, int]:
        try:
            addr = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
        except (ctypes.ArgumentError, TypeError):
            return _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[no-any-return]
        found = self._event_sets().get(addr)
        if found is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert found is not None
        return found

    # -- outside NVML: what the hardware does (`nodeagent sim health`, `sim xid`) ------------

    def set_health(self, index: int, **values: Any) -> None:
        """Set health values of GPU `index`: overrides (temperature_celsius, power_watts,
        sm_clock_mhz, memory_clock_mhz, throttle: reason names; each None: unchanged), counters
        that grow (ecc_corrected, ecc_uncorrected, pcie_replays: errors to add), flags
        (row_remap_pending, row_remap_failure: 0 or 1), the driver's recovery action
        (recovery_action: a name of RECOVERY_ACTIONS, or "unsupported": a driver without the
        field), and clear=True first drops every override. Raises SimError for bad values;
        then nothing changes."""
        check_health(values)
        with self.edit() as state:
            gpu = self._gpu_at(index)
            checkpoint_energy(state, self.health_clock())  # power may change from here
            h = gpu.health
            if values.get("clear"):
                h.temperature_celsius = h.power_watts = h.throttle = None
                h.sm_clock_mhz = h.memory_clock_mhz = None
            for key in ("temperature_celsius", "power_watts", "sm_clock_mhz", "memory_clock_mhz"):
                if values.get(key) is not None:
                    setattr(h, key, values[key])
            if values.get("throttle") is not None:
                h.throttle = sorted(set(values["throttle"]))
            for key, most in COUNTER_MAX.items():
                setattr(h, key, add_errors(getattr(h, key), int(values.get(key) or 0), most))
            for key in ("row_remap_pending", "row_remap_failure"):
                if values.get(key) is not None:
                    setattr(h, key, int(values[key]))
            if values.get("recovery_action") is not None:
                h.recovery_action = RECOVERY_ACTIONS.get(values["recovery_action"])

    def inject_xid(
        self, index: int, xid: int, count: int = 1, gi: int | None = None,
        recovery_action: str | None = None,
    ) -> None:  # fmt: skip
        """The driver reports XID `xid` on GPU `index`, `count` times; of its GPU instance `gi`
        (None: of the whole GPU); with `recovery_action` (a name of RECOVERY_ACTIONS) the
        driver also sets the GPU's recovery action, as it does with the XIDs NVIDIA's catalog
        links to Xid 154 (a driver without the field ignores it). Raises SimError (a GI that
        GPU does not have, an unknown action)."""
        check_xid(xid, count)
        check_recovery_action(recovery_action)
        with self.edit():
            gpu = self._gpu_at(index)
            if gi is not None and gi not in gpu.gis:
                have = ", ".join(map(str, sorted(gpu.gis))) or "none"
                raise SimError(f"GPU {index} has no GPU instance {gi} (its GPU instances: {have})")
            for _ in range(count):
                record_xid(gpu, xid, gi)
            if recovery_action is not None and gpu.health.recovery_action is not None:
                gpu.health.recovery_action = RECOVERY_ACTIONS[recovery_action]

    def _gpu_at(self, index: int) -> GpuState:
        gpus = self.state.gpus
        if not 0 <= index < len(gpus):
            raise SimError(f"GPU {index} does not exist (this node has {len(gpus)} GPUs)")
        return gpus[index]


def check_xid(xid: int, count: int) -> None:
    """Raises SimError for an XID code or count out of range."""
    if not 1 <= xid <= MAX_XID:
        raise SimError(f"XID must be 1 to {MAX_XID}, not {xid}")
    if not 1 <= count <= 1000:
        raise SimError(f"count must be 1 to 1000, not {count}")


def check_recovery_action(name: str | None, unsupported: bool = False) -> None:
    """Raises SimError for a name that is no recovery action (nor "unsupported", where
    allowed)."""
    if name is None or name in RECOVERY_ACTIONS or (unsupported and name == "unsupported"):
        return
    known = ", ".join([*RECOVERY_ACTIONS, *(["unsupported"] if unsupported else [])])
    raise SimError(f"{name!r} is no GPU recovery action; known: {known}")


def check_health(values: dict[str, Any]) -> None:
    """Raises SimError for the first value out of range or unknown reason name."""
    allowed = {
        "temperature_celsius": (0, MAX_TEMPERATURE - 1),
        "power_watts": (0, MAX_WATTS),
        "sm_clock_mhz": (0, 99_999),
        "memory_clock_mhz": (0, 99_999),
        "ecc_corrected": (0, MAX_COUNT),
        "ecc_uncorrected": (0, MAX_COUNT),
        "pcie_replays": (0, MAX_COUNT),
        "row_remap_pending": (0, 1),
        "row_remap_failure": (0, 1),
    }
    check_recovery_action(values.get("recovery_action"), unsupported=True)
    for key, value in values.items():
        if key in ("clear", "throttle", "recovery_action") or value is None:
            continue
        if key not in allowed:
            raise SimError(f"unknown health value {key!r}")
        low, high = allowed[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not low <= value <= high
        ):
            flag = "--" + key.replace("_", "-").replace("-celsius", "")
            raise SimError(f"{flag} must be {low:g} to {high:g}, not {value!r}")
    for name in values.get("throttle") or ():
        if name not in REASON_NAMES:
            raise SimError(
                f"{name!r} is no clock-event reason; known: {', '.join(REASON_NAMES)}, none"
            )
