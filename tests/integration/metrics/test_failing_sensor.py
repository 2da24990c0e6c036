"""One sensor read that fails (NVML_ERROR_UNKNOWN on one field of one GPU) costs that value
alone: never the `status`, `metrics` or `labels` command, never the other values of the GPU
nor the collector (it failed the whole `metrics` command with exit 3)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import NvmlSession
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml, parse_spec
from tests.integration.metrics.test_health import names, value
from tests.support.agent import make_agent
from tests.support.cli import Result

UNKNOWN = 999
SENSORS = {
    "nvmlDeviceGetTemperature": "nodeagent_gpu_temperature_celsius",
    "nvmlDeviceGetTotalEnergyConsumption": "nodeagent_gpu_energy_joules_total",
    "nvmlDeviceGetPcieReplayCounter": "nodeagent_gpu_pcie_replay_total",
    "nvmlDeviceGetPowerUsage": "nodeagent_gpu_power_watts",
}


@pytest.mark.parametrize("function", [*SENSORS, "nvmlDeviceGetUtilizationRates"])
@pytest.mark.parametrize("command", ["status", "metrics", "labels"])
def test_a_failing_sensor_read_never_fails_a_command(
    cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch, function: str, command: str
) -> None:
    monkeypatch.setenv(
        "NODEAGENT_SIM_FAULTS", json.dumps([{"function": function, "error": UNKNOWN}])
    )
    res = cli("--simulate", "h200", command)
    assert res.returncode == 0, res.stderr
    assert res.stdout


@pytest.mark.parametrize("function", SENSORS)
def test_a_failing_sensor_read_costs_only_its_value(function: str) -> None:
    lib = SimulatedNvml(
        parse_spec("h200"), faults=FaultPlan([Fault(function=function, error=UNKNOWN)])
    )
    agent = make_agent(NvmlSession(lib), lib.reset)
    agent.refresh()
    got = names(agent)
    assert SENSORS[function] not in got
    others = [n for f, n in SENSORS.items() if f != function]
    assert all(n in got for n in others), (others, got)
    assert value(agent, "nodeagent_collector_success", collector="health") == 1.0
    assert agent.session.error_counts()[function] >= 1  # counted: a failure, not an answer


def test_a_lost_gpu_still_fails_the_read() -> None:
    lost = FaultPlan([Fault(function="nvmlDeviceGetTemperature", error=15)])
    lib = SimulatedNvml(parse_spec("h200"), faults=lost)
    agent = make_agent(NvmlSession(lib), lib.reset)
    with pytest.raises(NvmlError) as err:  # every other read would fail too: not hidden
        agent.refresh()
    assert err.value.code == 15
