"""What each GPU offers: `nodeagent_gpu_sharing_info{gpu,strategy,replicas} 1`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric


class SharingCollector:
    name = "sharing"

    def __init__(self, offers: Callable[[], Mapping[int, tuple[str, int]]]) -> None:
        self.offers = offers

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "nodeagent_gpu_sharing_info",
            "How each GPU is shared (mig, mps, time-slicing, whole) and its replicas; value 1.",
            labels=["gpu", "strategy", "replicas"],
        )
        for index, (strategy, replicas) in sorted(self.offers().items()):
            info.add_metric([str(index), strategy, str(replicas)], 1)
        yield info
