"""The emulator's modelled NVML write times: none by default, the modelled time per write when
set (slept inside the call, under the emulator's lock), and NODEAGENT_SIM_LATENCY."""

from __future__ import annotations

from threading import get_ident

import pynvml
import pytest

from nodeagent.base.errors import SimError
from nodeagent.sim import SimulatedNvml, open_emulator, parse_spec
from nodeagent.sim.latency import parse_latency


def _slice_and_back(lib: SimulatedNvml) -> list[float]:
    """MIG on, a 1g slice made and destroyed; returns the sleeps the emulator took."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        assert lib.batch_lock.owner == get_ident()  # the call still holds NVML's lock
        slept.append(seconds)

    lib.sleep = sleep
    lib.nvmlInit()
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)
    profile = lib.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    gi = lib.nvmlDeviceCreateGpuInstance(gpu, profile.id)
    ci = lib.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    lib.nvmlDeviceGetCount()  # a read: never slowed
    lib.nvmlComputeInstanceDestroy(ci)
    lib.nvmlGpuInstanceDestroy(gi)
    return slept


def test_none_by_default() -> None:
    assert _slice_and_back(SimulatedNvml(parse_spec("h200"))) == []


def test_h200_profile_sleeps_each_write_its_modelled_time() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    lib.latency = parse_latency("h200")
    assert _slice_and_back(lib) == [4.0, 0.25, 0.10, 0.05, 0.10]


def test_a_failed_write_returns_at_once() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    lib.latency = parse_latency("create-gi=3")
    slept: list[float] = []
    lib.sleep = slept.append
    lib.nvmlInit()
    gpu = lib.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError):  # MIG is off: no GPU instance can be made
        lib.nvmlDeviceCreateGpuInstance(gpu, 19)
    assert slept == []


def test_op_list_sets_only_the_named_operations() -> None:
    assert parse_latency("create-gi=0.25, destroy-gi=0.05") == {
        "nvmlDeviceCreateGpuInstance": 0.25,
        "nvmlDeviceCreateGpuInstanceWithPlacement": 0.25,
        "nvmlGpuInstanceDestroy": 0.05,
    }
    assert parse_latency("off") == parse_latency("") == {}


@pytest.mark.parametrize("text", ["fast", "create-gi=soon", "create-gi", "reset=1", "create-ci=-1"])
def test_a_bad_value_is_one_sentence_naming_the_part(text: str) -> None:
    with pytest.raises(SimError) as err:
        parse_latency(text)
    message = str(err.value)
    assert "NODEAGENT_SIM_LATENCY" in message and f"'{text}'" in message and "\n" not in message


def test_the_environment_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEAGENT_SIM_LATENCY", "set-mig-mode=1.5")
    assert open_emulator("h200").latency == {"nvmlDeviceSetMigMode": 1.5}
    monkeypatch.delenv("NODEAGENT_SIM_LATENCY")
    assert open_emulator("h200").latency == {}
    monkeypatch.setenv("NODEAGENT_SIM_LATENCY", "bogus")
    with pytest.raises(SimError, match="'bogus'"):
        open_emulator("h200")
