"""Agents for tests: Settings built from defaults with a few groups changed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession
from nodeagent.settings import Settings
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
    return Agent(
        session, settings, lambda _s: reset, lock_path, clock, allocations, monotonic=monotonic
    )
