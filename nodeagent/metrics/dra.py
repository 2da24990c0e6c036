"""The DRA driver's metrics: how long prepares and unprepares take (and the NVML operations
inside them, apart), the claims prepared now by kind, the refusals by reason, and what the
ResourceSlice publisher wrote and found. Written by the driver (nodeagent.dra.node) and, after
each publish, the agent's dra-publish worker through DraStats; read per scrape by DraCollector,
which yields nothing until the driver is serving (DRA off: never).

    nodeagent_dra_prepare_duration_seconds{kind,result}     histogram
    nodeagent_dra_unprepare_duration_seconds{kind,result}   histogram
    nodeagent_dra_nvml_operation_duration_seconds{op}       histogram
    nodeagent_dra_claims_prepared{kind}                     gauge
    nodeagent_dra_refusals_total{reason}                    counter
    nodeagent_dra_status_writes_total{result}               counter (claims' status.devices)
    nodeagent_dra_slice_writes_total                        counter
    nodeagent_dra_partitionable_devices                     gauge (1 counters kept, 0 dropped)

Each share claim's request, limit and what it got: nodeagent.metrics.shares (set_shares).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from nodeagent.metrics.shares import ShareUsage, ShareView, measure
from nodeagent.state.snapshot import Inventory, ProcessUtilization

# A prepare is milliseconds (a slice there, an MPS daemon adopted) to tens of seconds (a MIG
# mode change, an NVML create on a busy GPU); the kubelet gives up after 45 s.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 45.0)
KINDS = ("mig", "mps", "gpu", "admin")


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(DURATION_BUCKETS, seconds)
        if i < len(DURATION_BUCKETS):
            self.counts[i] += 1
        self.total += seconds
        self.n += 1

    def buckets(self) -> list[tuple[str, float]]:
        out, seen = [], 0
        for bound, n in zip(DURATION_BUCKETS, self.counts, strict=True):
            seen += n
            out.append((repr(bound), float(seen)))
        out.append(("+Inf", float(self.n)))
        return out


class DraStats:
    """What the DRA driver did; thread-safe (the kubelet's calls run side by side)."""

    def __init__(self, utilization: Callable[[], ProcessUtilization] | None = None) -> None:
        """`utilization`: the utilization sampler's latest values (the store's), which the
        share claims are measured against; None: shares are shown unmeasured."""
        self.utilization = utilization
        self.lock = threading.Lock()
        self.prepares: dict[tuple[str, str], _Histogram] = {}
        self.unprepares: dict[tuple[str, str], _Histogram] = {}
        self.nvml: dict[str, _Histogram] = {}
        self.refusals: Counter[str] = Counter()
        self.prepared: dict[str, int] = {}
        self.status_writes: Counter[str] = Counter()
        # The ResourceSlice publisher's (writes made, counters dropped: None until known);
        # None until the driver serves.
        self.slices: tuple[int, bool | None] | None = None
        self.share_findings: Counter[str] = Counter()
        self.shares_over = 0
        self.shares: tuple[ShareUsage, ...] = ()
        self.shares_below: frozenset[str] = frozenset()

    def set_shares(self, views: Sequence[ShareView], inventory: Inventory) -> list[ShareUsage]:
        """The share watch's claims, measured against the latest samples: shown by the
        metrics and returned (the watch's HeldBelowRequest reads them)."""
        util = self.utilization() if self.utilization is not None else ProcessUtilization()
        usage = measure(views, util, inventory)
        with self.lock:
            self.shares = tuple(usage)
        return usage

    def set_shares_below(self, claims: frozenset[str]) -> None:
        """The claim UIDs held below their request now."""
        with self.lock:
            self.shares_below = claims

    def share_usage(self) -> tuple[Sequence[ShareUsage], frozenset[str]]:
        with self.lock:
            return self.shares, self.shares_below

    def share_finding(self, reason: str) -> None:
        with self.lock:
            self.share_findings[reason] += 1

    def set_shares_over(self, count: int) -> None:
        with self.lock:
            self.shares_over = count

    def observe_prepare(self, kind: str, seconds: float, ok: bool) -> None:
        with self.lock:
            key = (kind, "success" if ok else "failure")
            self.prepares.setdefault(key, _Histogram()).observe(seconds)

    def observe_unprepare(self, kind: str, seconds: float, ok: bool) -> None:
        with self.lock:
            key = (kind, "success" if ok else "failure")
            self.unprepares.setdefault(key, _Histogram()).observe(seconds)

    def observe_nvml(self, op: str, seconds: float) -> None:
        with self.lock:
            self.nvml.setdefault(op, _Histogram()).observe(seconds)

    def refused(self, reason: str) -> None:
        with self.lock:
            self.refusals[reason] += 1

    def set_prepared(self, counts: Mapping[str, int]) -> None:
        with self.lock:
            self.prepared = dict(counts)

    def status_written(self, ok: bool) -> None:
        with self.lock:
            self.status_writes["success" if ok else "failure"] += 1

    def slices_published(self, writes: int, counters_dropped: bool | None) -> None:
        """What the ResourceSlice publisher (nodeagent.dra.k8s.slices.SlicePublisher) did so far:
        its creates, patches and deletes, and whether the API server drops the counters."""
        with self.lock:
            self.slices = (writes, counters_dropped)


def _histogram(
    name: str, text: str, labels: list[str], table: Mapping[Any, _Histogram]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text, labels=labels)
    for key, hist in sorted(table.items()):
        family.add_metric(list(key), hist.buckets(), sum_value=hist.total)
    return family


class DraCollector:
    name = "dra"

    def __init__(self, stats: DraStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        with s.lock:
            if s.slices is None:  # the driver is not serving (DRA off): no families at all
                return
            slice_writes, dropped = s.slices
            families: list[Metric] = [
                _histogram(
                    "nodeagent_dra_prepare_duration_seconds",
                    "Time one claim's NodePrepareResources took, by the claim's kind and result.",
                    ["kind", "result"],
                    s.prepares,
                ),
                _histogram(
                    "nodeagent_dra_unprepare_duration_seconds",
                    "Time one claim's NodeUnprepareResources took, by the claim's kind and result.",
                    ["kind", "result"],
                    s.unprepares,
                ),
                _histogram(
                    "nodeagent_dra_nvml_operation_duration_seconds",
                    "Time each NVML MIG operation of a claim's change took, by operation.",
                    ["op"],
                    {(op,): h for op, h in s.nvml.items()},
                ),
            ]
            prepared = GaugeMetricFamily(
                "nodeagent_dra_claims_prepared",
                "Claims prepared on this node now, by kind.",
                labels=["kind"],
            )
            for kind in KINDS:
                prepared.add_metric([kind], s.prepared.get(kind, 0))
            families.append(prepared)
            refusals = CounterMetricFamily(
                "nodeagent_dra_refusals",
                "Prepares and unprepares refused or failed, by reason.",
                labels=["reason"],
            )
            for reason, n in sorted(s.refusals.items()):
                refusals.add_metric([reason], n)
            families.append(refusals)
            writes = CounterMetricFamily(
                "nodeagent_dra_status_writes",
                "Writes of claims' status.devices (a report: a failed one fails no prepare),"
                " by result.",
                labels=["result"],
            )
            for result in ("success", "failure"):
                writes.add_metric([result], s.status_writes.get(result, 0))
            families.append(writes)
            findings = CounterMetricFamily(
                "nodeagent_dra_share_findings",
                "Times an MPS share claim went over its share or lost its server, by reason"
                " (OverThreadShare, OverMemoryShare, ServerRestarted, WaitingForOtherUser).",
                labels=["reason"],
            )
            for reason, n in sorted(s.share_findings.items()):
                findings.add_metric([reason], n)
            families.append(findings)
            families.append(
                GaugeMetricFamily(
                    "nodeagent_dra_shares_over_limit",
                    "MPS share claims whose clients are over their share (or whose server"
                    " restarted, or that block another user's client) now.",
                    value=s.shares_over,
                )
            )
        yield from families
        yield CounterMetricFamily(
            "nodeagent_dra_slice_writes",
            "ResourceSlice creates, patches and deletes the driver made.",
            value=slice_writes,
        )
        if dropped is not None:
            yield GaugeMetricFamily(
                "nodeagent_dra_partitionable_devices",
                "1 when the API server kept the ResourceSlices' counters (the"
                " DRAPartitionableDevices feature gate is on), 0 when it dropped them.",
                value=0 if dropped else 1,
            )
