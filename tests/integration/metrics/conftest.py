"""An agent over an emulated node with a known layout and load, for the metrics tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodeagent.agent.service import Agent
from nodeagent.sim import SimulatedNvml
from tests.support.metrics import build_agent


@pytest.fixture
def agent_factory() -> Callable[..., tuple[Agent, SimulatedNvml]]:
    made: list[Agent] = []

    def make(
        spec: str, config: str | None, loads: list[tuple[int, str, float]]
    ) -> tuple[Agent, SimulatedNvml]:
        agent, lib = build_agent(spec, config, loads)
        made.append(agent)
        return agent, lib

    yield make
    for agent in made:
        agent.stop()
