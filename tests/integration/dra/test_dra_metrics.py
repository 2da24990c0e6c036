"""The DRA driver's metrics (nodeagent.metrics.dra): each prepare and unprepare timed by kind
and result, the NVML operations inside apart, the claims prepared now, refusals by reason;
and the exposition passes `promtool check metrics`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from nodeagent.agent.factory import dra_driver
from nodeagent.base.errors import AgentError
from nodeagent.dra.claims import ClaimRef
from nodeagent.metrics.dra import DraCollector, DraStats
from nodeagent.nvml import NvmlSession
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.dra import allocated_claim, mps_config, no_reset, node_config
from tests.support.metrics import prometheus_tool


def test_prepares_unprepares_and_refusals_are_counted(short_root: Path) -> None:
    state = short_root / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2"), state))
    stats = DraStats()
    node = dra_driver(
        session, Settings(), node_config(short_root), no_reset,
        state.with_name(".sim.json.lock"), stats=stats,
    )  # fmt: skip
    stats.slices_published(3, False)  # as the agent's dra-publish worker tells it
    registry = CollectorRegistry()
    registry.register(DraCollector(stats))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    slice_claim = allocated_claim("asr", "uid-1", {"g": "gpu-0-mig-1g18gb-19-0"})
    node.prepare(ClaimRef("speech", "asr", "uid-1"), slice_claim)
    whole = allocated_claim("llm", "uid-2", {"g": "gpu-1"})
    node.prepare(ClaimRef("speech", "llm", "uid-2"), whole)
    bad = allocated_claim("x", "uid-3", {"g": "gpu-0-mig-1g18gb-19-1"}, mps_config(50))
    with pytest.raises(AgentError):
        node.prepare(ClaimRef("speech", "x", "uid-3"), bad)
    over = allocated_claim("y", "uid-4", {"g": "gpu-0-mig-2g35gb-14-0"})
    with pytest.raises(AgentError):
        node.prepare(ClaimRef("speech", "y", "uid-4"), over)

    assert value("nodeagent_dra_prepare_duration_seconds_count", kind="mig", result="success") == 1
    assert value("nodeagent_dra_prepare_duration_seconds_count", kind="gpu", result="success") == 1
    # a refusal is counted by its claim's kind once its devices are read (the slice in use: a
    # MIG claim); one refused before (its config unreadable) by the default, gpu
    assert value("nodeagent_dra_prepare_duration_seconds_count", kind="mig", result="failure") == 1
    assert value("nodeagent_dra_prepare_duration_seconds_count", kind="gpu", result="failure") == 1
    assert value("nodeagent_dra_claims_prepared", kind="mig") == 1
    assert value("nodeagent_dra_claims_prepared", kind="gpu") == 1
    assert value("nodeagent_dra_claims_prepared", kind="mps") == 0
    assert value("nodeagent_dra_refusals_total", reason="bad-input") == 1
    assert value("nodeagent_dra_refusals_total", reason="in-use") == 1
    # MIG on, GI, CI: each NVML operation of the change timed on its own
    for op in ("set-mig-mode", "create-gi", "create-ci"):
        assert value("nodeagent_dra_nvml_operation_duration_seconds_count", op=op) == 1
    assert value("nodeagent_dra_slice_writes_total") == 3
    assert value("nodeagent_dra_partitionable_devices") == 1

    node.unprepare("uid-1")
    assert (
        value("nodeagent_dra_unprepare_duration_seconds_count", kind="mig", result="success") == 1
    )
    assert value("nodeagent_dra_claims_prepared", kind="mig") == 0
    assert value("nodeagent_dra_nvml_operation_duration_seconds_count", op="destroy-gi") == 1

    text = generate_latest(registry).decode()
    promtool = prometheus_tool("promtool")
    if promtool:
        proc = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (
            proc.stdout + proc.stderr
        )
    session.close()


def test_nothing_is_exposed_while_dra_is_off() -> None:
    registry = CollectorRegistry()
    registry.register(DraCollector(DraStats()))
    assert "nodeagent_dra" not in generate_latest(registry).decode()
