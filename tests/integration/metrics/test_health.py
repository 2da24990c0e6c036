"""Health series from the emulator: values that follow the load and what `nodeagent sim`
sets, absent where NVML answers NOT_SUPPORTED, XIDs from `nodeagent sim xid` counted."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.codes import NOT_SUPPORTED
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]
GIB = 1024**3


def samples(agent: Agent) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(agent.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(agent: Agent, name: str, **labels: str) -> float | None:
    return samples(agent).get((name, frozenset(labels.items())))


def names(agent: Agent) -> set[str]:
    return {name for name, _ in samples(agent)}


def test_values_follow_the_load(agent_factory: Callable[..., tuple[Agent, SimulatedNvml]]) -> None:
    agent, _ = agent_factory("h200x2", None, [(0, "", 1.0)])
    busy, idle = {"gpu": "0"}, {"gpu": "1"}
    assert value(agent, "nodeagent_gpu_power_limit_watts", **idle) == 700.0
    assert value(agent, "nodeagent_gpu_power_watts", **idle) == 75.0
    assert value(agent, "nodeagent_gpu_power_watts", **busy) == 595.0  # 85 % of the limit
    assert value(agent, "nodeagent_gpu_temperature_celsius", **idle) == 30.0
    assert value(agent, "nodeagent_gpu_temperature_celsius", **busy) == 66.0
    assert value(agent, "nodeagent_gpu_clock_hertz", gpu="1", clock="sm") == 345e6
    assert value(agent, "nodeagent_gpu_clock_hertz", gpu="0", clock="sm") == 1980e6
    assert value(agent, "nodeagent_gpu_clock_hertz", gpu="0", clock="memory") == 3201e6
    assert value(agent, "nodeagent_gpu_clock_throttle", gpu="1", reason="gpu_idle") == 1.0
    assert value(agent, "nodeagent_gpu_clock_throttle", gpu="0", reason="gpu_idle") == 0.0
    for severity in ("corrected", "uncorrected"):
        for scope in ("volatile", "aggregate"):
            labels = {"gpu": "0", "severity": severity, "scope": scope}
            assert value(agent, "nodeagent_gpu_ecc_errors_total", **labels) == 0.0
    assert value(agent, "nodeagent_gpu_row_remap_pending", **idle) == 0.0
    assert value(agent, "nodeagent_gpu_pcie_replay_total", **idle) == 0.0
    assert value(agent, "nodeagent_gpu_last_xid", **idle) == 0.0


def test_energy_grows_with_time_and_load() -> None:
    now = [time.time() + 100.0]
    lib = SimulatedNvml(parse_spec("h200x2"))
    lib.health_clock = lambda: now[0]
    lib.set_health(0, ecc_corrected=0)  # a checkpoint at the fake clock's start
    agent = make_agent(NvmlSession(lib), lib.reset)
    agent.refresh()
    start = [value(agent, "nodeagent_gpu_energy_joules_total", gpu=g) for g in "01"]
    lib.attach("0", 700, GIB, 1.0)
    now[0] += 10.0
    agent.refresh()
    end = [value(agent, "nodeagent_gpu_energy_joules_total", gpu=g) for g in "01"]
    assert end[0] - start[0] == pytest.approx(5950.0)  # 595 W for 10 s
    assert end[1] - start[1] == pytest.approx(750.0)  # idle: 75 W
    lib.detach(700)
    now[0] += 1.0
    agent.refresh()  # power falls; the counter never does
    after = value(agent, "nodeagent_gpu_energy_joules_total", gpu="0")
    assert after is not None and after - end[0] == pytest.approx(75.0)


def test_not_supported_reads_are_absent_not_zero() -> None:
    faults = [
        Fault(function="nvmlDeviceGetPcieReplayCounter", error=NOT_SUPPORTED),
        Fault(function="nvmlDeviceGetTemperature", error=NOT_SUPPORTED),
        Fault(function="nvmlDeviceGetSupportedEventTypes", error=NOT_SUPPORTED),
    ]
    lib = SimulatedNvml(parse_spec("h200"), faults=FaultPlan(faults))
    agent = make_agent(NvmlSession(lib), lib.reset)
    agent.refresh()
    got = names(agent)
    assert "nodeagent_gpu_pcie_replay_total" not in got
    assert "nodeagent_gpu_temperature_celsius" not in got
    assert "nodeagent_gpu_xid_errors_total" not in got and "nodeagent_gpu_last_xid" not in got
    assert value(agent, "nodeagent_gpu_power_watts", gpu="0") == 75.0
    assert value(agent, "nodeagent_collector_success", collector="health") == 1.0
    assert agent.session.error_counts() == {}  # an answer, not an error


def test_mig_devices_report_what_nvml_gives_per_mig_device(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, _ = agent_factory("h200", "all-1g.18gb", [])
    got = samples(agent)
    slice_series = {
        (n, dict(labels)["scope"]) for n, labels in got if n.startswith("nodeagent_slice_ecc")
    }
    assert slice_series == {("nodeagent_slice_ecc_errors_total", "volatile")}
    assert sum(1 for n, _ in got if n == "nodeagent_slice_ecc_errors_total") == 7
    assert not any(n.startswith("nodeagent_slice_temperature") for n, _ in got)
    # the GPU's volatile counts are not supported with MIG on; its aggregate ones are
    ecc = {dict(labels)["scope"] for n, labels in got if n == "nodeagent_gpu_ecc_errors_total"}
    assert ecc == {"aggregate"}


def test_sim_health_values_show(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim = ("--simulate", "h200x2", "--sim-state", str(state))
    assert cli(*sim, "status").returncode == 0
    lib = SimulatedNvml(parse_spec("h200x2"), state)
    agent = make_agent(NvmlSession(lib), lib.reset)
    args = ["--temperature", "90", "--ecc-uncorrected", "3", "--row-remap-pending", "1"]
    res = cli(*sim, "sim", "health", "--gpu", "1", *args, "--pcie-replays", "4")
    assert res.returncode == 0, res.stderr
    agent.refresh()
    assert value(agent, "nodeagent_gpu_temperature_celsius", gpu="1") == 90.0
    assert value(agent, "nodeagent_gpu_clock_throttle", gpu="1", reason="sw_thermal_slowdown") == 1
    labels = {"gpu": "1", "severity": "uncorrected", "scope": "aggregate"}
    assert value(agent, "nodeagent_gpu_ecc_errors_total", **labels) == 3.0
    assert value(agent, "nodeagent_gpu_row_remap_pending", gpu="1") == 1.0
    assert value(agent, "nodeagent_gpu_pcie_replay_total", gpu="1") == 4.0
    assert value(agent, "nodeagent_gpu_temperature_celsius", gpu="0") == 30.0
    assert (
        cli(*sim, "sim", "health", "--gpu", "1", "--clear", "--throttle", "hw_slowdown").returncode
        == 0
    )
    agent.refresh()
    assert value(agent, "nodeagent_gpu_temperature_celsius", gpu="1") == 30.0
    assert value(agent, "nodeagent_gpu_clock_throttle", gpu="1", reason="hw_slowdown") == 1.0
    assert value(agent, "nodeagent_gpu_clock_throttle", gpu="1", reason="gpu_idle") == 0.0
    assert value(agent, "nodeagent_gpu_pcie_replay_total", gpu="1") == 4.0  # counters stay


def test_xid_from_sim_shows_in_the_counter_and_last_xid(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim = ("--simulate", "h200x2", "--sim-state", str(state))
    assert cli(*sim, "status").returncode == 0
    lib = SimulatedNvml(parse_spec("h200x2"), state)
    agent = make_agent(NvmlSession(lib), lib.reset)
    agent.refresh()  # the agent watches from here on
    assert value(agent, "nodeagent_gpu_xid_errors_total", gpu="0", xid="79") == 0.0
    assert cli(*sim, "sim", "xid", "--gpu", "0", "--xid", "79").returncode == 0
    assert cli(*sim, "sim", "xid", "--gpu", "0", "--xid", "31", "--count", "2").returncode == 0
    agent.refresh()
    assert value(agent, "nodeagent_gpu_xid_errors_total", gpu="0", xid="79") == 1.0
    assert value(agent, "nodeagent_gpu_xid_errors_total", gpu="0", xid="31") == 2.0
    assert value(agent, "nodeagent_gpu_last_xid", gpu="0") == 31.0
    assert value(agent, "nodeagent_gpu_last_xid", gpu="1") == 0.0
    assert value(agent, "nodeagent_gpu_xid_errors_total", gpu="1", xid="31") is None
    agent.refresh()  # events are counted once
    assert value(agent, "nodeagent_gpu_xid_errors_total", gpu="0", xid="31") == 2.0


def test_bad_sim_health_input_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    sim = ("--simulate", "h200x2", "--sim-state", str(state))
    assert cli(*sim, "status").returncode == 0
    before = state.read_bytes()
    cases = [
        (("health", "--gpu", "2", "--temperature", "80"), ("GPU 2",)),
        (("health", "--gpu", "0", "--temperature", "-1"), ("--temperature",)),
        (("health", "--gpu", "0", "--power-watts", "nan"), ("--power-watts",)),
        (("health", "--gpu", "0", "--ecc-corrected", "-3"), ("--ecc-corrected",)),
        (("health", "--gpu", "0", "--throttle", "gpu_idle,hot"), ("'hot'",)),
        (("health", "--gpu", "0"), ("at least one",)),
        (("xid", "--gpu", "0", "--xid", "0"), ("XID",)),
        (("xid", "--gpu", "0", "--xid", "79", "--count", "0"), ("count",)),
        (("xid", "--gpu", "9", "--xid", "79"), ("GPU 9",)),
    ]
    for args, words in cases:
        assert_one_error(cli(*sim, "sim", *args), 2, *words)
    assert state.read_bytes() == before
    assert_one_error(
        cli("--simulate", "h200", "sim", "xid", "--gpu", "0", "--xid", "79"), 2, "--sim-state"
    )


def test_a_state_file_without_health_still_loads(cli: Cli, tmp_path: Path) -> None:
    """State files of an older nodeagent have no health: the emulated driver loads then."""
    import json

    state = tmp_path / "node.json"
    sim = ("--simulate", "h200", "--sim-state", str(state))
    assert cli(*sim, "status").returncode == 0
    data = json.loads(state.read_text())
    for gpu in data["gpus"]:
        del gpu["health"]
    state.write_text(json.dumps(data))
    assert cli(*sim, "sim", "xid", "--gpu", "0", "--xid", "13").returncode == 0
    res = cli(*sim, "metrics")
    assert res.returncode == 0, res.stderr
    assert 'nodeagent_gpu_temperature_celsius{gpu="0"} 30.0' in res.stdout
