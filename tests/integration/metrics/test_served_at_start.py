"""The endpoint answers from the moment it listens: a first reconcile that takes long (here the
kubelet's pod-resources answer never comes until the test allows it) leaves /metrics served
with what is known."""

from __future__ import annotations

import threading

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Holders
from tests.integration.metrics.test_endpoint_hostile import scrape
from tests.support.agent import make_agent

TIMEOUT = 30.0  # a bound on waits that normally end in milliseconds


def test_metrics_are_served_while_the_first_reconcile_is_blocked() -> None:
    lib = SimulatedNvml(parse_spec("h200x2"))
    asked, answer = threading.Event(), threading.Event()

    def blocked_allocations() -> Holders:  # the injected fake: answers when the test says
        asked.set()
        assert answer.wait(TIMEOUT)
        return {}

    agent = make_agent(NvmlSession(lib), lib.reset, allocations=blocked_allocations)
    starting = threading.Thread(target=agent.start)
    starting.start()
    try:
        assert asked.wait(TIMEOUT), "the first reconcile never asked for allocations"
        assert agent.server is not None
        status, body = scrape("127.0.0.1", agent.server.port)
        assert status == 200
        assert b'nodeagent_collector_success{collector="gpus"} 1.0' in body
        ready = scrape("127.0.0.1", agent.server.port, "/readyz")
        assert ready == (503, b"first reconcile not done\n")
    finally:
        answer.set()
        starting.join(TIMEOUT)
        agent.stop()
    assert agent.pipeline.last_report is not None
    assert agent.pipeline.last_report.result == "success"
