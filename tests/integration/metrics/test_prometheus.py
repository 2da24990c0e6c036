"""A real Prometheus (Debian package `prometheus`) scrapes the agent over loopback."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.metrics import http_get, prometheus_server, prometheus_tool, wait_for
from tests.support.mig_apply import reconfigure


@pytest.fixture
def running_agent() -> Iterator[tuple[Agent, SimulatedNvml]]:
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "generated")
    reconfigure(session, cfg, "all-balanced", lib.reset)
    agent = make_agent(
        session,
        lib.reset,
        metrics={"refresh_interval_seconds": 0.2, "gpm_interval_seconds": 0.2},
    )
    agent.start()
    yield agent, lib
    agent.stop()


def test_endpoints(running_agent: tuple[Agent, SimulatedNvml]) -> None:
    agent, _ = running_agent
    assert agent.server is not None
    base = f"http://127.0.0.1:{agent.server.port}"
    status, body = http_get(base + "/metrics")
    assert status == 200 and "nodeagent_slice_info{" in body
    assert http_get(base + "/healthz") == (200, "ok\n")
    assert http_get(base + "/readyz") == (200, "ok\n")
    assert http_get(base + "/nope")[0] == 404


@pytest.fixture
def prometheus(tmp_path: Path, running_agent: tuple[Agent, SimulatedNvml]) -> Iterator[str]:
    binary = prometheus_tool("prometheus")
    agent, _ = running_agent
    assert agent.server is not None
    config = (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: nodeagent\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{agent.server.port}']\n"
    )
    with prometheus_server(binary, tmp_path, config) as base:
        wait_for(lambda: http_get(base + "/-/ready")[0] == 200, "Prometheus to be ready")
        yield base


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    status, body = http_get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert status == 200, body
    data = json.loads(body)
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def test_prometheus_sees_every_slice_and_forgets_destroyed_ones(
    prometheus: str, running_agent: tuple[Agent, SimulatedNvml]
) -> None:
    agent, lib = running_agent
    assert agent.store.snapshot is not None
    inv = agent.store.snapshot.inventory
    want = {(str(g.index), str(s.gi_id)) for g in inv.gpus for s in g.slices}
    assert len(want) == 8

    def memory_series() -> set[tuple[str, str]]:
        rows = _query(prometheus, "nodeagent_slice_memory_total_bytes")
        return {(r["metric"]["gpu"], r["metric"]["gi_id"]) for r in rows}

    wait_for(lambda: memory_series() == want, "every slice's memory series")
    joined = _query(
        prometheus,
        'nodeagent_slice_memory_total_bytes * on(gpu, gi_id, ci_id) group_left(profile) nodeagent_slice_info{profile="3g.71gb"}',
    )
    assert {float(r["value"][1]) for r in joined} == {71424 * 1024 * 1024}
    cfg = parse_config(dump_config(generate_configs(inv)), "generated")
    reconfigure(agent.session, cfg, "all-7g.141gb", lib.reset)
    wait_for(
        lambda: _query(prometheus, 'count(nodeagent_slice_info{profile="7g.141gb"})'),
        "the new slices",
    )
    wait_for(
        lambda: not _query(prometheus, 'nodeagent_slice_info{profile!="7g.141gb"}'),
        "the old slices to go",
    )
    assert len(_query(prometheus, "nodeagent_slice_memory_total_bytes")) == 2
