"""MPS series: daemon up, restarts, limits, servers and clients."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodeagent.state.snapshot import Store


class MpsCollector:
    """The MPS daemon's status as the pipeline and the probe last published it."""

    name = "mps"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        status = self.store.mps
        if status is None:  # MPS not managed by this agent
            return
        yield GaugeMetricFamily(
            "nodeagent_mps_daemon_up",
            "1 if the MPS control daemon answers.",
            value=float(status.running),
        )
        yield CounterMetricFamily(
            "nodeagent_mps_restarts",
            "Times the agent restarted the MPS control daemon.",
            value=status.restarts,
        )
        if status.thread_percentage is not None:
            yield GaugeMetricFamily(
                "nodeagent_mps_active_thread_ratio",
                "Default active thread percentage of MPS clients, as a ratio.",
                value=status.thread_percentage / 100.0,
            )
        limits = GaugeMetricFamily(
            "nodeagent_mps_pinned_memory_limit_bytes",
            "Default pinned device memory limit per MPS device index (0 = none).",
            labels=["device"],
        )
        for device, n in sorted(status.pinned_bytes.items()):
            limits.add_metric([str(device)], float(n or 0))
        yield limits
        yield GaugeMetricFamily(
            "nodeagent_mps_servers", "MPS servers running.", value=len(status.servers)
        )
        yield GaugeMetricFamily(
            "nodeagent_mps_clients",
            "MPS clients connected.",
            value=sum(len(c) for c in status.clients.values()),
        )
