"""One clock for every worker: an agent given a virtual monotonic clock runs its periodic work
when that clock says an interval has passed, not when the wall clock does, so a test moves
time forward instead of sleeping through intervals."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nodeagent.nvml import NvmlSession
from tests.support.agent import make_agent
from tests.support.clock import ManualClock

HOUR = 3600.0


def _until(predicate: Callable[[], bool], what: str) -> None:
    """Wait (real time, bounded) for work that virtual time made due to be done."""
    done = threading.Event()
    for _ in range(400):
        if predicate():
            return
        done.wait(0.025)
    raise AssertionError(f"not done: {what}")


def test_advancing_the_virtual_clock_runs_every_worker_an_hour_later(
    make_session: Callable[..., NvmlSession],
) -> None:
    session = make_session("h200")
    clock = ManualClock()
    agent = make_agent(
        session,
        lambda _gpu: None,
        monotonic=clock,
        metrics={"refresh_interval_seconds": HOUR, "gpm_interval_seconds": HOUR},
        reconcile={"interval_seconds": HOUR},
    )
    agent.start(serve=False)  # reads and reconciles once, then the workers wait an hour
    try:
        generation = agent.store.snapshot.generation if agent.store.snapshot else 0
        runs = sum(agent.stats.reconciles.values())
        _until(lambda: all(w.heartbeat == 0.0 for w in agent.workers.values()), "heartbeats")
        assert agent.store.snapshot is not None
        assert agent.store.snapshot.generation == generation  # an hour has not passed
        clock.now += HOUR + 1
        _until(lambda: sum(agent.stats.reconciles.values()) > runs, "a reconcile an hour later")
        _until(
            lambda: (
                agent.store.snapshot is not None
                and agent.store.snapshot.generation > generation + 1
            ),  # refresh and reconcile read
            "a refresh an hour later",
        )
        assert agent.healthy() == (True, "ok")
    finally:
        agent.stop()
