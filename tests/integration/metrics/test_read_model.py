"""One read model: a scrape reads the snapshot store (and the stats its owners write), never the
owners themselves. An agent with MPS managed reconciles once, then one collect() runs under a
profiler: no function of the pipeline, the MPS manager, the workers, the NVML session or the
agent's service runs, and the series those owners published are there, with their values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault
from nodeagent.state.workers import Worker
from tests.support.agent import make_agent
from tests.support.reach import modules_run

# What a scrape must not run: the owners of what it shows publish into the store instead.
OWNERS = (
    "nodeagent.agent.service", "nodeagent.reconcile", "nodeagent.mps", "nodeagent.nvml",
    "nodeagent.dra", "nodeagent.kube", "nodeagent.sharing", "nodeagent.state.workers",
    "nodeagent.state.sampling",
)  # fmt: skip
IN_USE = 19  # NVML_ERROR_IN_USE


@pytest.fixture
def agent(
    tmp_path: Path, fake_mps_control: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Agent, SimulatedNvml]]:
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    lib = SimulatedNvml(parse_spec("h200x2"))
    mps = {
        "enabled": True,
        "replicas": 4,
        "pipe_dir": tmp_path / "pipe",
        "log_dir": tmp_path / "log",
        "control": fake_mps_control,
        "stop_on_exit": True,
    }
    agent = make_agent(NvmlSession(lib), lib.reset, mps=mps)
    yield agent, lib
    agent.stop()


def test_a_scrape_reads_the_store_not_the_owners(agent: tuple[Agent, SimulatedNvml]) -> None:
    agent_, lib = agent
    lib.faults.faults.append(Fault(function="nvmlDeviceGetMemoryInfo", error=IN_USE))
    agent_.reconcile()  # fails in observe: one NVML error counted
    lib.faults.faults.clear()
    agent_.reconcile()  # starts the MPS daemon, publishes the offers

    reached = modules_run(lambda: list(agent_.registry.collect()))

    assert "nodeagent.metrics.mps" in reached and "nodeagent.metrics.sharing" in reached
    assert sorted(m for m in reached if m.startswith(OWNERS)) == []
    # A worker publishes its count when made (0), then after each failure.
    Worker("refresh", lambda: None, lambda: 60.0, agent_.stop_event,
           on_errors=agent_.store.publish_worker_errors)  # fmt: skip
    value = agent_.registry.get_sample_value
    assert value("nodeagent_mps_daemon_up") == 1.0
    for gpu in ("0", "1"):
        labels = {"gpu": gpu, "strategy": "mps", "replicas": "4"}
        assert value("nodeagent_gpu_sharing_info", labels) == 1.0
    assert value("nodeagent_nvml_errors_total", {"function": "nvmlDeviceGetMemoryInfo"}) == 1.0
    assert value("nodeagent_worker_errors_total", {"worker": "refresh"}) == 0.0


def test_the_mps_probe_publishes_what_it_read(agent: tuple[Agent, SimulatedNvml]) -> None:
    agent_, _ = agent
    agent_.reconcile()
    assert agent_.registry.get_sample_value("nodeagent_mps_restarts_total") == 0.0
    assert agent_.mps.daemon is not None
    agent_.mps.daemon.stop()  # the daemon dies behind the agent's back
    agent_.probe_mps()  # the probe restarts it and publishes the new status
    assert agent_.registry.get_sample_value("nodeagent_mps_restarts_total") == 1.0
    assert agent_.registry.get_sample_value("nodeagent_mps_daemon_up") == 1.0
