"""The informers' pauses after failed passes (nodeagent.kube.reconnect): full jitter up to a
ceiling that doubles with each failure, ended early when the API server is back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from tenacity import wait_fixed

from nodeagent.base.errors import KubeError
from nodeagent.kube.informer import Informer, ShortWatch, Source
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
    _waits_until_interrupted(reconnect)


def test_a_pass_that_began_before_another_was_answered_does_not_arm_the_pause_again() -> None:
    """Both watches fail in the outage; the claims watch's next request is under way (its 503,
    or its dropped connection, is of before) when the Node watch is answered: its failure
    says nothing new, and its next pause ends at once (found under load: it waited its whole
    backoff, ~21 s, as before the shared way back)."""
    reconnect = Reconnect(first_seconds=60, max_seconds=60)
    reconnect.failed()
    began = reconnect.answers  # the claims watch's pass begins
    reconnect.answered()  # the Node watch is back
    reconnect.failed(began)  # the claims watch's request, sent before, fails now
    started = time.monotonic()
    reconnect.pause(3)
    assert time.monotonic() - started < 1
    # A pass that began after the answer and fails is a new outage: it waits again.
    reconnect.failed(reconnect.answers)
    _waits_until_interrupted(reconnect)


def _waits_until_interrupted(reconnect: Reconnect) -> None:
    """A pause begun now is still waiting 0.3 s on, and ends once the agent stops. Its wait
    is made a fixed 60 s: a random one up to 60 s is under 0.3 s one time in 200."""
    reconnect.wait = wait_fixed(60)
    pausing = threading.Thread(target=reconnect.pause, args=(1,))
    pausing.start()
    pausing.join(0.3)
    assert pausing.is_alive()
    reconnect.interrupt()
    pausing.join(5)
    assert not pausing.is_alive()


class _Kept:
    def listed(self, objects: Sequence[Any]) -> None:
        pass

    def changed(self, kind: str, obj: Any) -> None:
        pass


def _informer(source: Source, reconnect: Reconnect, stop: threading.Event) -> Informer[Any]:
    return Informer(source, lambda obj: obj, _Kept(), stop, reconnect=reconnect)


def test_a_watch_that_never_failed_does_not_end_a_failing_ones_pause() -> None:
    """Only the API server coming back ends the pauses: the Node's healthy watch says nothing
    of the claims' own failure (a 403 on them alone keeps their backoff)."""
    reconnect, stop = Reconnect(first_seconds=60, max_seconds=60), threading.Event()
    reconnect.wait = wait_fixed(60)  # a random wait up to 60 s is under 0.5 s one time in 120

    def refused(version: str | None) -> Iterator[tuple[str, Any]]:
        raise KubeError("Kubernetes API: watch resourceclaims failed: HTTP 403 Forbidden")
        yield  # a generator, as a watch is

    def events(version: str | None) -> Iterator[tuple[str, Any]]:
        yield "MODIFIED", {"metadata": {"name": "n1", "resourceVersion": "7"}}

    failing = _informer(Source("resourceclaims", lambda: ([], "1"), refused), reconnect, stop)
    healthy = _informer(Source("nodes", lambda: ([], "1"), events), reconnect, stop)
    with pytest.raises(KubeError):
        failing.run()
    pausing = threading.Thread(target=failing.run)
    pausing.start()
    healthy.run()  # answered, never failed
    pausing.join(0.5)
    assert pausing.is_alive()  # still in its pause
    stop.set()
    reconnect.interrupt()
    pausing.join(5)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watching(clock: _Clock, seconds: float, *events: tuple[str, Any]) -> Source:
    """A source whose watches deliver `events` and end `seconds` after they began."""

    def watch(version: str | None) -> Iterator[tuple[str, Any]]:
        yield from events
        clock.now += seconds

    return Source("nodes", lambda: ([], "1"), watch)


def test_a_watch_that_ends_at_once_with_no_event_fails_and_the_next_waits() -> None:
    """client-go's "very short watch": an API server (or a proxy) answering every watch with
    200 and an empty body made the agent watch again at once, 1,500-2,000 times a second."""
    reconnect, stop, clock = Reconnect(), threading.Event(), _Clock()
    informer = Informer(_watching(clock, 0.2), lambda o: o, _Kept(), stop,
                        reconnect=reconnect, clock=clock)  # fmt: skip
    with pytest.raises(ShortWatch) as err:
        informer.run()
    assert str(err.value) == (
        "Kubernetes API: watch nodes ended after 0.20 s with no event (a very short watch: the"
        " API server, or a proxy before it, ends watches at once); watching again after a"
        " backoff (1 in a row)"
    )
    assert informer.failures == 0 and not reconnect.down  # the server answered: no outage
    reconnect.wait = wait_fixed(60)
    pausing = threading.Thread(target=informer.run)
    pausing.start()
    pausing.join(0.3)
    assert pausing.is_alive()  # the next pass waits its backoff before it watches
    stop.set()  # the agent stops: the wait ends
    pausing.join(5)
    assert not pausing.is_alive()


@pytest.mark.parametrize(
    ("seconds", "events"),
    [(1.0, ()), (0.0, (("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),))],
    ids=["a-second-with-no-event", "a-bookmark-at-once"],
)
def test_a_watch_that_lasts_or_delivers_is_no_failure(
    seconds: float, events: tuple[tuple[str, Any], ...]
) -> None:
    clock = _Clock()
    informer = Informer(_watching(clock, seconds, *events), lambda o: o, _Kept(), threading.Event(),
                        clock=clock)  # fmt: skip
    informer.run()
    informer.run()
    assert informer.short == 0 and informer.failures == 0
