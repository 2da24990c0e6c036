"""Agents for tests on the emulated node: Settings built from defaults with a few groups changed,
the emulated node and its generated MIG configs, and the agents a test started, stopped after it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodeagent.agent.factory import build_agent
from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Allocations


def make_settings(base: Settings | None = None, **groups: Mapping[str, Any]) -> Settings:
    """`make_settings(metrics={"address": "127.0.0.1:0"}, mps={"enabled": True})`."""
    s = base or Settings()
    for name, values in groups.items():
        s = dataclasses.replace(s, **{name: dataclasses.replace(getattr(s, name), **values)})
    return s


class SteppedClock:
    """time.monotonic() plus the steps a test took: an agent on it sees a GPM window of 100+
    ms pass without the test sleeping it (the emulator only needs the later sample later)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def make_agent(
    session: NvmlSession,
    reset: Callable[[int], None],
    lock_path: Path | None = None,
    allocations: Allocations | None = None,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    **groups: Mapping[str, Any],
) -> Agent:
    """An Agent on `session`; `clock` dates its snapshots, `monotonic` drives its workers (a
    test passes virtual ones)."""
    metrics = {"address": "127.0.0.1:0", **groups.pop("metrics", {})}
    settings = make_settings(metrics=metrics, **groups)
    return build_agent(
        session, settings, lambda _s: reset, lock_path, clock, allocations, monotonic=monotonic
    )


def emulated_node(
    spec: str = "h200x2", state: Path | None = None
) -> tuple[SimulatedNvml, NvmlSession]:
    """An emulated node (`spec`, kept in the state file `state` if given) and a session on it."""
    lib = SimulatedNvml(parse_spec(spec), state)
    return lib, NvmlSession(lib)


def generated_mig_file(session: NvmlSession, path: Path) -> Path:
    """The MIG configs generated from the node's GPUs (`nodeagent mig generate-config`), at
    `path`."""
    path.write_text(dump_config(generate_configs(read_inventory(session))))
    return path


# Fast enough for a test: metrics refreshed every 0.5 s, no reconcile timer in the way.
QUICK = {"metrics": {"refresh_interval_seconds": 0.5}, "reconcile": {"interval_seconds": 300}}


class Agents:
    """The agents a test started (`start`), stopped when it ends (the `agents` fixture)."""

    def __init__(self) -> None:
        self.started: list[Agent] = []

    def start(
        self, session: NvmlSession, reset: Callable[[int], None], **groups: Mapping[str, Any]
    ) -> Agent:
        """An agent on `session` with the QUICK intervals and `groups`, started."""
        agent = make_agent(session, reset, **{**QUICK, **groups})
        agent.start()
        self.started.append(agent)
        return agent

    def stop_all(self) -> None:
        for agent in self.started:
            agent.stop()
