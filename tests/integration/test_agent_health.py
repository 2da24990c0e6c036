"""Health while a long MIG change runs: readers wait for the NVML lock by design, so neither
/healthz nor the watchdog may kill the agent in the middle of a GPU reset."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.clock import ManualClock


def test_a_long_reset_keeps_the_agent_healthy(tmp_path: Path) -> None:
    lib = SimulatedNvml(parse_spec("a100-40gb"))  # Ampere: MIG mode needs a GPU reset
    session = NvmlSession(lib)
    mig = tmp_path / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    in_reset, release = threading.Event(), threading.Event()

    def slow_reset(index: int) -> None:
        in_reset.set()
        assert release.wait(30)
        lib.reset(index)

    clock = ManualClock(1_000_000.0)  # the inventory's age, as the health check sees it
    agent = make_agent(
        session,
        slow_reset,
        clock=clock,
        mig={"config_file": str(mig)},
        metrics={"refresh_interval_seconds": 0.05},
        reconcile={"interval_seconds": 3600},
    )
    agent.start()
    try:
        assert agent.healthy() == (True, "ok")
        new = dataclasses.replace(
            agent.settings, mig=dataclasses.replace(agent.settings.mig, config="all-balanced")
        )
        agent.reload(new)
        assert in_reset.wait(10)
        assert agent.pipeline.applying
        clock.now += 3600  # an hour into the reset: the inventory is an hour old
        assert agent.healthy() == (True, "ok")
        release.set()
        deadline = threading.Event()
        for _ in range(200):
            report = agent.pipeline.last_report
            if not agent.pipeline.applying and report and report.wanted.mig_config:
                break
            deadline.wait(0.05)
        assert report is not None and report.result == "success", report
        clock.now += 1
        for _ in range(200):  # the refresh worker reads again once the lock is free
            snap = agent.store.snapshot
            if snap is not None and snap.taken_at == clock.now:
                break
            deadline.wait(0.05)
        assert agent.healthy() == (True, "ok")
    finally:
        release.set()
        agent.stop()
