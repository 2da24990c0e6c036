"""`nodeagent run` waits for NVML at start (node.nvml-wait) instead of exiting into a crash
loop: the emulator's nvmlInit fails as a driver that is still loading does, in virtual time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.cli.run import NVML_RETRY_SECONDS, wait_for_nvml
from nodeagent.nvml import NvmlSession, open_session
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault, FaultPlan
from tests.support.cli import captured_logs

DRIVER_NOT_LOADED = 9


class Clock:
    """Virtual time: sleep() advances it, and records each sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture(autouse=True)
def logs() -> Iterator[list[dict[str, Any]]]:
    with captured_logs("info") as events:
        yield events


def _library(failures: int) -> SimulatedNvml:
    faults = [Fault(function="nvmlInit", call=n, error=DRIVER_NOT_LOADED) for n in range(1, 1 + failures)]  # fmt: skip
    return SimulatedNvml(parse_spec("h200"), faults=FaultPlan(faults, in_process=True))


def test_waits_until_nvml_answers_logging_every_attempt(logs: list[dict[str, Any]]) -> None:
    lib, clock, status = _library(3), Clock(), []
    session = wait_for_nvml(lambda: open_session(lib), 600, clock.sleep, lambda: False,
                            clock, status.append)  # fmt: skip
    assert isinstance(session, NvmlSession) and session.lib is lib
    assert clock.sleeps == [NVML_RETRY_SECONDS] * 3
    waits = [e for e in logs if e["event"] == "nvml.waiting"]
    assert {e["log_level"] for e in waits} == {"warning"}  # shown at the default level
    assert [e["waited_seconds"] for e in waits] == [0, 5, 10]
    assert all("Driver Not Loaded" in e["error"] for e in waits)
    assert status[0].startswith("waiting for NVML (0 s of 600 s): ")
    session.close()


def test_gives_up_with_the_last_error_when_the_wait_is_over() -> None:
    clock = Clock()
    with pytest.raises(NvmlError) as err:
        wait_for_nvml(lambda: open_session(_library(99)), 12, clock.sleep, lambda: False, clock)
    assert err.value.code == DRIVER_NOT_LOADED
    assert str(err.value) == (
        "NVML nvmlInit failed (still refused after the 12 s node.nvml-wait): Driver Not Loaded"
        " (NVML error 9)"
    )
    assert clock.sleeps == [5.0, 5.0, 2.0]  # never past the wait it was given


def test_zero_wait_fails_at_once_as_before() -> None:
    clock = Clock()
    with pytest.raises(NvmlError):
        wait_for_nvml(lambda: open_session(_library(1)), 0, clock.sleep, lambda: False, clock)
    assert clock.sleeps == []


def test_a_stop_during_the_wait_returns_none() -> None:
    clock = Clock()
    stopped = lambda: len(clock.sleeps) >= 2  # noqa: E731 - SIGTERM after the second attempt
    assert (
        wait_for_nvml(lambda: open_session(_library(99)), 600, clock.sleep, stopped, clock) is None
    )
    assert len(clock.sleeps) == 2
