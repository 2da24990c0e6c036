"""Decoding NVML's health answers: units, clock-event reason bits, ECC keys, row remapping, and
"not supported" as absent (None), never 0."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.nvml.health import THROTTLE_REASONS, decode_throttle, read_health
from nodeagent.nvml.session import NvmlSession


class _Error(Exception):
    def __init__(self, value: int) -> None:
        self.value = value


class _Lib:
    """Answers the health calls from a table; a missing entry answers NOT_SUPPORTED (3)."""

    NVMLError = _Error

    def __init__(self, answers: dict[Any, Any]) -> None:
        self.answers = answers

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(_handle: Any, *args: Any) -> Any:
            key = (name, *args) if args else name
            if key not in self.answers:
                raise _Error(3)
            answer = self.answers[key]
            if isinstance(answer, _Error):
                raise answer
            return answer

        return call


@pytest.mark.parametrize(
    ("mask", "active"),
    [
        (0x0, set()),
        (0x1, {"gpu_idle"}),
        (0x4 | 0x20, {"sw_power_cap", "sw_thermal_slowdown"}),
        (0x1FF, {name for name, _ in THROTTLE_REASONS}),
        (0x200 | 0x400 | 0x8, {"hw_slowdown"}),  # board limit, reliability: not in the list
    ],
)
def test_throttle_mask_decodes_to_every_known_reason(mask: int, active: set[str]) -> None:
    decoded = decode_throttle(mask)
    assert list(decoded) == [name for name, _ in THROTTLE_REASONS]
    assert {name for name, on in decoded.items() if on} == active


def test_units_and_keys() -> None:
    lib = _Lib(
        {
            ("nvmlDeviceGetTemperature", 0): 41,
            "nvmlDeviceGetPowerUsage": 123456,  # mW
            "nvmlDeviceGetEnforcedPowerLimit": 700000,
            "nvmlDeviceGetTotalEnergyConsumption": 5_000_250,  # mJ
            ("nvmlDeviceGetClockInfo", 1): 1980,  # MHz
            ("nvmlDeviceGetClockInfo", 2): 3201,
            "nvmlDeviceGetCurrentClocksEventReasons": 0x24,
            ("nvmlDeviceGetTotalEccErrors", 0, 0): 5,
            ("nvmlDeviceGetTotalEccErrors", 0, 1): 17,
            ("nvmlDeviceGetTotalEccErrors", 1, 1): 2,
            "nvmlDeviceGetRemappedRows": (3, 1, 1, 0),
            "nvmlDeviceGetPcieReplayCounter": 9,
        }
    )
    h = read_health(NvmlSession(lib), object())
    assert h.temperature_celsius == 41
    assert h.power_watts == pytest.approx(123.456)
    assert h.power_limit_watts == 700.0
    assert h.energy_joules == pytest.approx(5000.25)
    assert (h.sm_clock_hertz, h.memory_clock_hertz) == (1_980_000_000, 3_201_000_000)
    assert h.throttle is not None
    assert {k for k, v in h.throttle.items() if v} == {"sw_power_cap", "sw_thermal_slowdown"}
    # uncorrected volatile answered NOT_SUPPORTED: left out, not 0
    assert dict(h.ecc_errors) == {
        ("corrected", "volatile"): 5,
        ("corrected", "aggregate"): 17,
        ("uncorrected", "aggregate"): 2,
    }
    assert (h.row_remap_pending, h.row_remap_failure) == (True, False)
    assert h.pcie_replays == 9


def test_nothing_supported_is_all_absent() -> None:
    h = read_health(NvmlSession(_Lib({})), object())
    assert h.temperature_celsius is None and h.power_watts is None and h.energy_joules is None
    assert h.sm_clock_hertz is None and h.memory_clock_hertz is None and h.throttle is None
    assert h.ecc_errors == {} and h.row_remap_pending is None and h.pcie_replays is None


def test_older_driver_falls_back_to_the_throttle_reasons_name() -> None:
    lib = _Lib({"nvmlDeviceGetCurrentClocksThrottleReasons": 0x1})
    h = read_health(NvmlSession(lib), object())
    assert h.throttle is not None and h.throttle["gpu_idle"]


def test_a_real_failure_is_raised_not_hidden() -> None:
    from nodeagent.base.errors import NvmlError

    lib = _Lib({("nvmlDeviceGetTemperature", 0): _Error(15)})  # GPU is lost
    with pytest.raises(NvmlError) as info:
        read_health(NvmlSession(lib), object())
    assert info.value.code == 15
