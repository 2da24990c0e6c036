"""Per-process utilization on a real GPU (MIG off) under a CUDA load (torch matmul loop): the
agent's exposition shows the load's pid busy, then the pid gone once it ends. Read-only: the
agent is refreshed by hand, never reconciled."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession, read_inventory
from tests.support.agent import make_agent

pytestmark = pytest.mark.gpu


def _per_pid(agent: Agent, name: str) -> dict[tuple[str, str], float]:
    text = generate_latest(agent.registry).decode()
    return {
        (s.labels["gpu"], s.labels["pid"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_the_loads_pid_shows_busy_then_goes(
    session: NvmlSession, load: subprocess.Popen[str]
) -> None:
    gpus = read_inventory(session).gpus
    if gpus[0].mig_current:
        pytest.skip("GPU 0 has MIG enabled: NVML has no per-process utilization there")
    gpu = next((g for g in gpus if load.pid in {p.pid for p in g.processes}), None)
    assert gpu is not None, f"NVML lists the load's pid {load.pid} on no GPU"
    agent = make_agent(session, lambda _index: None)
    key = (str(gpu.index), str(load.pid))
    agent.refresh()  # from the driver's whole sample buffer
    time.sleep(1.5)
    agent.refresh()  # the samples of the last 1.5 s only
    sm = _per_pid(agent, "nodeagent_process_sm_utilization_ratio")
    memory = _per_pid(agent, "nodeagent_process_memory_utilization_ratio")
    info = _per_pid(agent, "nodeagent_process_info")
    util = agent.registry.get_sample_value(
        "nodeagent_gpu_utilization_ratio", {"gpu": str(gpu.index)}
    )
    print(f"under load: pid {load.pid} sm {sm.get(key)} memory {memory.get(key)}, GPU {util}")
    assert sm[key] > 0.5
    assert key in info
    assert util is not None and util > 0.5
    load.kill()
    load.wait()
    time.sleep(1.5)
    agent.refresh()  # may still carry the load's last samples
    time.sleep(1.5)
    agent.refresh()
    after = _per_pid(agent, "nodeagent_process_sm_utilization_ratio")
    print(f"after the load ended: {after}")
    assert key not in after
    assert key not in _per_pid(agent, "nodeagent_process_info")
