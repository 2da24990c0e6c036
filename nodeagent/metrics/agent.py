"""The agent's own series: build, reconciles, NVML errors, sampler health."""

from __future__ import annotations

import bisect
import platform
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from nodeagent import __version__
from nodeagent.state.snapshot import Store

BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0)


@dataclass
class AgentStats:
    """Written by the reconcile loop, read by the collector."""

    reconciles: Counter[str] = field(default_factory=Counter)
    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    duration_sum: float = 0.0
    duration_count: int = 0
    last_success: float | None = None
    steps: dict[str, list[float]] = field(default_factory=dict)  # step -> [buckets..., sum, n]
    reload_success: float | None = None  # None until the first reload
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe_step(self, step: str, seconds: float) -> None:
        with self.lock:
            row = self.steps.setdefault(step, [0.0] * (len(STEP_BUCKETS) + 2))
            i = bisect.bisect_left(STEP_BUCKETS, seconds)
            if i < len(STEP_BUCKETS):
                row[i] += 1
            row[-2] += seconds
            row[-1] += 1

    def observe_run(self, result: str, seconds: float, now: float) -> None:
        with self.lock:
            self.reconciles[result] += 1
            i = bisect.bisect_left(BUCKETS, seconds)
            if i < len(BUCKETS):
                self.bucket_counts[i] += 1
            self.duration_sum += seconds
            self.duration_count += 1
            if result == "success":
                self.last_success = now


class AgentCollector:
    """The reconciles from `stats`; the workers' and NVML's errors and the inventory's age from
    the store (their owners publish them there)."""

    name = "agent"

    def __init__(self, stats: AgentStats, store: Store) -> None:
        self.stats = stats
        self.store = store

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "nodeagent_build_info",
            "nodeagent build; value 1.",
            labels=["version", "python_version"],
        )
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        with self.stats.lock:
            reconciles = CounterMetricFamily(
                "nodeagent_reconciles", "Reconciles by result.", labels=["result"]
            )
            for result in ("success", "failure"):
                reconciles.add_metric([result], self.stats.reconciles.get(result, 0))
            cumulative, buckets = 0, []
            for bound, n in zip(BUCKETS, self.stats.bucket_counts, strict=True):
                cumulative += n
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", self.stats.duration_count))
            histogram = HistogramMetricFamily(
                "nodeagent_reconcile_duration_seconds",
                "Time a reconcile took.",
                buckets=buckets,
                sum_value=self.stats.duration_sum,
            )
            last = self.stats.last_success
            steps = HistogramMetricFamily(
                "nodeagent_reconcile_step_duration_seconds",
                "Time each named step of the reconcile pipeline took.",
                labels=["step"],
            )
            for step, row in sorted(self.stats.steps.items()):
                seen = 0.0
                step_buckets: list[tuple[str, float]] = []
                for step_bound, count in zip(STEP_BUCKETS, row, strict=False):
                    seen += count
                    step_buckets.append((repr(step_bound), seen))
                step_buckets.append(("+Inf", row[-1]))
                steps.add_metric([step], step_buckets, sum_value=row[-2])
            reload = self.stats.reload_success
        yield reconciles
        yield histogram
        yield steps
        if reload is not None:
            yield GaugeMetricFamily(
                "nodeagent_config_reload_success",
                "1 if the last settings reload (SIGHUP) was taken, 0 if it was refused.",
                value=reload,
            )
        workers = CounterMetricFamily(
            "nodeagent_worker_errors",
            "Exceptions a worker caught and recovered from, by worker.",
            labels=["worker"],
        )
        for worker, n in sorted(self.store.worker_errors.items()):
            workers.add_metric([worker], n)
        yield workers
        if last is not None:
            yield GaugeMetricFamily(
                "nodeagent_last_reconcile_success_timestamp_seconds",
                "When a reconcile last succeeded (Unix time).",
                value=last,
            )
        errors = CounterMetricFamily(
            "nodeagent_nvml_errors", "NVML calls that failed, by function.", labels=["function"]
        )
        for function, n in sorted(self.store.nvml_errors.items()):
            errors.add_metric([function], n)
        yield errors
        snap = self.store.snapshot
        if snap is not None:
            yield GaugeMetricFamily(
                "nodeagent_inventory_timestamp_seconds",
                "When the GPUs were last read (Unix time).",
                value=snap.taken_at,
            )
