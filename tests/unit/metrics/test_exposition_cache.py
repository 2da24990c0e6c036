"""The exposition is rendered at most once per change of the data, and a scrape never waits
behind another scrape's render: it gets the last render (one sample older) at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from nodeagent.metrics.exposition import ExpositionCache

WAIT = 10.0  # a bound on waits that end at once; never a timing assertion


class Slow:
    """A collector whose render waits for `go` once `hold` is set; `value` is what it shows."""

    def __init__(self) -> None:
        self.value = 1.0
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.go = threading.Event()
        self.renders = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.renders += 1
        if self.hold.is_set():
            self.entered.set()
            assert self.go.wait(WAIT)
        yield GaugeMetricFamily("slow", "A value.", value=self.value)


def cache() -> tuple[ExpositionCache, Slow]:
    registry = CollectorRegistry()
    slow = Slow()
    registry.register(slow)
    return ExpositionCache(registry), slow


def test_rendered_once_per_change() -> None:
    exposition, slow = cache()
    first = exposition.latest()
    assert b"slow 1.0" in first
    renders = slow.renders
    assert exposition.latest() is first and exposition.fresh() is first
    assert slow.renders == renders
    slow.value = 2.0
    exposition.changed()
    assert exposition.fresh() is None
    assert b"slow 2.0" in exposition.latest()
    assert slow.renders == renders + 1


def test_a_scrape_during_a_render_gets_the_last_render_at_once() -> None:
    exposition, slow = cache()
    before = exposition.latest()
    slow.value = 2.0
    slow.hold.set()
    exposition.changed()
    rendered: list[bytes] = []
    renderer = threading.Thread(target=lambda: rendered.append(exposition.latest()))
    renderer.start()
    assert slow.entered.wait(WAIT)  # the render is under way, held by the collector
    assert exposition.latest() is before  # not a wait: the render holds until `go`
    slow.go.set()
    renderer.join(WAIT)
    assert b"slow 2.0" in rendered[0]
    assert exposition.latest() is rendered[0]


def test_the_first_render_is_waited_for() -> None:
    exposition, slow = cache()
    slow.hold.set()
    answers: list[bytes] = []
    first = threading.Thread(target=lambda: answers.append(exposition.latest()))
    first.start()
    assert slow.entered.wait(WAIT)
    second = threading.Thread(target=lambda: answers.append(exposition.latest()))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # nothing rendered yet: it waits for the first render
    slow.go.set()
    first.join(WAIT)
    second.join(WAIT)
    assert len(answers) == 2 and all(b"slow 1.0" in a for a in answers)
