"""GPU health reads: temperature, power, energy, clocks, clock-event reasons, ECC, row
remapping, PCIe replays, and XID errors through an NVML event set.

Every read that the GPU (or a MIG device) does not support is None, never 0: a dashboard must
tell "no errors" from "cannot know".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.base.logs import get_logger
from nodeagent.nvml.codes import (
    FUNCTION_NOT_FOUND,
    GONE,
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    TIMEOUT,
)
from nodeagent.nvml.fields import read_recovery_action
from nodeagent.nvml.session import NvmlSession, gpu_handle

log = get_logger("nodeagent.nvml")

TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
CLOCK_SM, CLOCK_MEM = 1, 2  # NVML_CLOCK_SM, NVML_CLOCK_MEM
CORRECTED, UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
VOLATILE, AGGREGATE = 0, 1  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
_NO_ID = 0xFFFFFFFF
MHZ = 1_000_000

# nvmlClocksEventReason* bits, by the name the metrics use (the order of the NVML header).
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
ECC_COUNTERS: tuple[tuple[str, str, int, int], ...] = (
    ("corrected", "volatile", CORRECTED, VOLATILE),
    ("corrected", "aggregate", CORRECTED, AGGREGATE),
    ("uncorrected", "volatile", UNCORRECTED, VOLATILE),
    ("uncorrected", "aggregate", UNCORRECTED, AGGREGATE),
)
# A MIG device handle answers INVALID_ARGUMENT (not NOT_SUPPORTED) for some device-wide reads.
_ABSENT = (NOT_SUPPORTED, INVALID_ARGUMENT, FUNCTION_NOT_FOUND)


def decode_throttle(mask: int) -> dict[str, bool]:
    """The clock-event reason bit mask as {reason: active} for every known reason; bits NVML
    may add later are ignored."""
    return {name: bool(mask & bit) for name, bit in THROTTLE_REASONS}


@dataclass(frozen=True)
class Health:
    """One read of a GPU's (or a MIG device's) health counters; None: not supported there."""

    temperature_celsius: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since the driver loaded
    sm_clock_hertz: int | None = None
    memory_clock_hertz: int | None = None
    throttle: Mapping[str, bool] | None = None  # every reason of THROTTLE_REASONS
    ecc_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # supported only
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    pcie_replays: int | None = None
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (read by read_fault_counters only): None where the
    # driver does not report it, or it was not read
    recovery_action: int | None = None


def read_health(
    session: NvmlSession, handle: Any, unsupported: set[tuple[Any, ...]] | None = None
) -> Health:
    """Every health counter of one GPU or MIG device handle.

    `unsupported`, kept by the caller per device, holds the reads the device answered "not
    supported" before: the hardware's and the driver's answer, fixed while NVML is loaded, so
    they are not asked again (a MIG device answers 12 of the 15 so; 750 NVML calls a read of
    a 56-slice node saves). A read that fails otherwise (UNKNOWN, TIMEOUT) costs that value
    alone, this time. nvidia-smi equivalent: `nvidia-smi -q -d TEMPERATURE,POWER,CLOCK,
    PERFORMANCE,ECC,ROW_REMAPPER` and `--query-gpu=pcie.replay_counter`. Raises NvmlError only
    where NVML or the GPU is gone (nodeagent.nvml.session.GONE).
    """
    read = _reader(session, handle, unsupported)
    temperature = read("nvmlDeviceGetTemperature", TEMPERATURE_GPU)
    power = read("nvmlDeviceGetPowerUsage")
    limit = read("nvmlDeviceGetEnforcedPowerLimit")
    energy = read("nvmlDeviceGetTotalEnergyConsumption")
    sm_clock = read("nvmlDeviceGetClockInfo", CLOCK_SM)
    mem_clock = read("nvmlDeviceGetClockInfo", CLOCK_MEM)
    reasons = _clock_event_reasons(session, read)
    ecc = {
        (severity, scope): int(count)
        for severity, scope, error_type, counter in ECC_COUNTERS
        if (count := read("nvmlDeviceGetTotalEccErrors", error_type, counter)) is not None
    }
    remap = read("nvmlDeviceGetRemappedRows")
    replays = read("nvmlDeviceGetPcieReplayCounter")
    return Health(
        temperature_celsius=None if temperature is None else int(temperature),
        power_watts=None if power is None else int(power) / 1000.0,
        power_limit_watts=None if limit is None else int(limit) / 1000.0,
        energy_joules=None if energy is None else int(energy) / 1000.0,
        sm_clock_hertz=None if sm_clock is None else int(sm_clock) * MHZ,
        memory_clock_hertz=None if mem_clock is None else int(mem_clock) * MHZ,
        throttle=None if reasons is None else decode_throttle(int(reasons)),
        ecc_errors=ecc,
        row_remap_pending=None if remap is None else bool(remap[2]),
        row_remap_failure=None if remap is None else bool(remap[3]),
        pcie_replays=None if replays is None else int(replays),
    )


def _reader(
    session: NvmlSession, handle: Any, unsupported: set[tuple[Any, ...]] | None
) -> Callable[..., Any]:
    """One read of `handle`: None where the device does not support it (remembered in
    `unsupported`) or the read failed this time; raises NvmlError where NVML or the GPU is
    gone."""
    skip = unsupported if unsupported is not None else set()

    def read(function: str, *args: Any) -> Any:
        if (function, *args) in skip:
            return None
        try:
            value = session.call(function, handle, *args, absent=_ABSENT)
        except NvmlError as err:
            if err.code in GONE:
                raise
            return None  # this value only, this time (counted in the session's errors)
        if value is None:
            skip.add((function, *args))
        return value

    return read


def read_fault_counters(
    session: NvmlSession, handle: Any, unsupported: set[tuple[Any, ...]] | None = None
) -> Health:
    """Only the counters that say a GPU or MIG device is faulty: the uncorrected ECC counts, the
    row-remap flags and the driver's recovery action (4 NVML calls where read_health makes 15;
    a MIG device answers the recovery action "not supported" once), for a poll much more
    frequent than the metrics'. nvidia-smi equivalent: `nvidia-smi -q -d ECC,ROW_REMAPPER` and
    its "Recovery Action". Raises NvmlError only where NVML or the GPU is gone."""
    read = _reader(session, handle, unsupported)
    ecc = {
        (severity, scope): int(count)
        for severity, scope, error_type, counter in ECC_COUNTERS
        if severity == "uncorrected"
        if (count := read("nvmlDeviceGetTotalEccErrors", error_type, counter)) is not None
    }
    remap = read("nvmlDeviceGetRemappedRows")
    try:
        action = read_recovery_action(session, handle, unsupported)
    except NvmlError as err:
        if err.code in GONE:
            raise
        action = None  # this time only
    return Health(
        ecc_errors=ecc,
        row_remap_pending=None if remap is None else bool(remap[2]),
        row_remap_failure=None if remap is None else bool(remap[3]),
        recovery_action=action,
    )


def _clock_event_reasons(session: NvmlSession, read: Callable[[str], Any]) -> int | None:
    """nvmlDeviceGetCurrentClocksEventReasons (R535+), else its older name ...ThrottleReasons."""
    for function in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        if hasattr(session.lib, function):
            value = read(function)
            if value is not None:
                return int(value)
    return None


def mig_handle(session: NvmlSession, mig_uuid: str) -> Any:
    """The MIG device handle of a MIG UUID, or None when it no longer exists."""
    return session.call("nvmlDeviceGetHandleByUUID", mig_uuid, absent=(NOT_FOUND,))


@dataclass(frozen=True)
class Xid:
    """One XID critical error event: the GPU, the XID code, and the MIG instance it hit
    (None when NVML does not name one)."""

    gpu: int
    xid: int
    gi_id: int | None = None
    ci_id: int | None = None


class XidWatcher:
    """An NVML event set registered for XID critical errors on every GPU that supports them.

    An event set only receives the events that happen after registration; `poll()` drains
    what arrived since the last poll without waiting (nvmlEventSetWait_v2 with timeout 0).
    """

    def __init__(self, session: NvmlSession) -> None:
        self.session = session
        self.watched: set[int] = set()
        self._set: Any = None

    def watch(self, index: int) -> bool:
        """Register GPU `index` (once); False when it cannot report XIDs (NOT_SUPPORTED, or
        an NVML that refuses the event set: logged, not fatal). nvidia-smi equivalent: none
        (`dmesg | grep Xid` shows the same events)."""
        if index in self.watched:
            return True
        try:
            dev = gpu_handle(self.session, index)
            types = self.session.call("nvmlDeviceGetSupportedEventTypes", dev, absent=_ABSENT)
            if types is None or not int(types) & XID_CRITICAL_ERROR:
                return False
            if self._set is None:
                self._set = self.session.call("nvmlEventSetCreate")
            self.session.call("nvmlDeviceRegisterEvents", dev, XID_CRITICAL_ERROR, self._set)
        except NvmlError as err:
            log.warning("xid.watch_failed", gpu=index, error=str(err))
            return False
        self.watched.add(index)
        return True

    def poll(self, limit: int = 1024) -> list[Xid]:
        """The XID events since the last poll (at most `limit`, the rest stay queued)."""
        if self._set is None:
            return []
        events = []
        for _ in range(limit):
            data = self.session.call("nvmlEventSetWait_v2", self._set, 0, absent=(TIMEOUT,))
            if data is None:
                break
            if int(data.eventType) & XID_CRITICAL_ERROR:
                index = int(self.session.call("nvmlDeviceGetIndex", data.device))
                gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
                events.append(
                    Xid(
                        gpu=index,
                        xid=int(data.eventData),
                        gi_id=None if gi == _NO_ID else gi,
                        ci_id=None if ci == _NO_ID else ci,
                    )
                )
        return events

    def close(self) -> None:
        if self._set is not None:
            self.session.call("nvmlEventSetFree", self._set)
            self._set = None
            self.watched.clear()
