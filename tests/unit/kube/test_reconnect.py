"""The informers' pauses after failed passes (nodeagent.kube.reconnect): full jitter up to a
ceiling that doubles with each failure, ended early when the API server is back."""

from __future__ import annotations

import threading
import time

import pytest

from nodeagent.kube.reconnect import Reconnect


@pytest.mark.parametrize(
    ("failures", "ceiling"), [(0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (40, 30)]
)
def test_a_pause_is_a_random_wait_up_to_the_doubling_ceiling(failures: int, ceiling: float) -> None:
    delays = [Reconnect().delay(failures) for _ in range(200)]
    assert all(0 <= d <= ceiling for d in delays)
    if ceiling:
        assert len(set(delays)) > 150  # drawn, not the same wait on every node
        assert max(delays) > ceiling * 0.8 and min(delays) < ceiling * 0.2


@pytest.mark.parametrize("ending", ["answered", "interrupt"])
def test_a_pause_ends_when_another_informer_is_answered_or_the_agent_stops(ending: str) -> None:
    reconnect = Reconnect(first_seconds=60, max_seconds=60)
    reconnect.failed()
    threading.Timer(0.2, getattr(reconnect, ending)).start()
    began = time.monotonic()
    reconnect.pause(3)
    assert time.monotonic() - began < 5


def test_a_pause_after_a_new_failure_waits_again() -> None:
    reconnect = Reconnect(first_seconds=60, max_seconds=60)
    reconnect.failed()
    reconnect.answered()
    reconnect.failed()  # down again: the earlier answer ends no pause
    pausing = threading.Thread(target=reconnect.pause, args=(1,))
    pausing.start()
    pausing.join(0.3)
    assert pausing.is_alive()
    reconnect.interrupt()
    pausing.join(5)
    assert not pausing.is_alive()
