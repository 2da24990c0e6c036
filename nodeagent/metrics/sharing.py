"""What each GPU offers: `nodeagent_gpu_sharing_info{gpu,strategy,replicas} 1`."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.state.snapshot import Store


class SharingCollector:
    """The offers as the pipeline last published them."""

    name = "sharing"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "nodeagent_gpu_sharing_info",
            "How each GPU is shared (mig, mps, time-slicing, whole) and its replicas; value 1.",
            labels=["gpu", "strategy", "replicas"],
        )
        for index, (strategy, replicas) in sorted(self.store.offers.items()):
            info.add_metric([str(index), strategy, str(replicas)], 1)
        yield info
