"""Runs every collector per scrape; each reports its own success and duration, and one that
fails never fails the scrape."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeagent.base.logs import get_logger

log = get_logger("nodeagent.metrics")


class NamedCollector(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]: ...


class CollectorSet(Collector):
    """The one collector registered with the registry; it runs the others."""

    def __init__(self, collectors: Sequence[NamedCollector]) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterator[Metric]:
        success = GaugeMetricFamily(
            "nodeagent_collector_success",
            "1 if the collector ran without error in this scrape.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "nodeagent_collector_duration_seconds",
            "Time the collector took in this scrape.",
            labels=["collector"],
        )
        for collector in self.collectors:
            start = time.perf_counter()
            try:
                metrics = list(collector.collect())
                ok = 1.0
            except Exception as err:  # one collector must never fail the scrape
                log.warning("collector.failed", collector=collector.name, error=repr(err))
                metrics, ok = [], 0.0
            duration.add_metric([collector.name], time.perf_counter() - start)
            success.add_metric([collector.name], ok)
            yield from metrics
        yield success
        yield duration
