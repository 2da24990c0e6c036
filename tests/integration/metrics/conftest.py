"""An agent over an emulated node with a known layout and load, for the metrics tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from nodeagent.agent import Agent
from nodeagent.mig.apply import reconfigure
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.agent_support import make_agent

GIB = 1024**3


def build_agent(
    spec: str, config: str | None, loads: list[tuple[int, str, float]]
) -> tuple[Agent, SimulatedNvml]:
    """An Agent on `spec` after applying generated config `config` (None: MIG stays off), with
    one process per (gpu, profile, load): attached to the first slice of that profile, or to
    the GPU when profile is ''."""
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "generated")
        reconfigure(session, cfg, config, lib.reset)
    inv = read_inventory(session)
    for n, (gpu, profile, load) in enumerate(loads):
        if profile:
            device = next(s.mig_uuid for s in inv.gpus[gpu].slices if s.profile == profile)
        else:
            device = str(gpu)
        lib.attach(device or "", 500 + n, (n + 1) * GIB, load)
    agent = make_agent(session, lib.reset)
    sample(agent)
    return agent, lib


def sample(agent: Agent) -> None:
    """Refresh the inventory and take two GPM samples 100+ ms apart."""
    agent.refresh()
    agent.gpm.tick()
    time.sleep(0.12)
    agent.gpm.tick()


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
