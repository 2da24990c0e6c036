"""Which pod holds each GPU, MIG slice or shared replica (kubelet pod-resources, in the Snapshot).

Info series, value 1, joinable with the value series on their keys: `nodeagent_slice_pod_info`
on gpu, gi_id, ci_id; `nodeagent_gpu_pod_info` on gpu. A device id the node does not have is
left out; a holder gone from the kubelet's answer is gone at the next refresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.base.units import whole_number
from nodeagent.state.snapshot import Holder, Holders, Inventory, Store


@dataclass(frozen=True)
class Attribution:
    """The holders of a node's devices: per slice (gpu, gi_id, ci_id, MIG UUID, holder) and per
    GPU or replica (gpu, GPU UUID, replica, holder), each sorted."""

    slices: list[tuple[int, int, int, str, Holder]]
    gpus: list[tuple[int, str, str, Holder]]


def _replica_order(row: tuple[int, str, str, Holder]) -> tuple[int, int, str, Holder]:
    gpu, _, replica, holder = row
    number = whole_number(replica)  # ASCII digits only: '²' passes isdigit() but not int()
    return gpu, number if number is not None else -1, replica, holder


def attribute(inventory: Inventory, holders: Holders) -> Attribution:
    """Place every held device id (`<uuid>` or `<uuid>::<n>`) on a slice or GPU of `inventory`.
    Ids the node does not have are dropped; replicas of a MIG slice are the slice, so a
    container holding several counts once."""
    gpus = {g.uuid: g.index for g in inventory.gpus}
    slices = {
        s.mig_uuid: (g.index, s.gi_id, s.ci_id)
        for g in inventory.gpus
        for s in g.slices
        if s.mig_uuid is not None and s.ci_id is not None
    }
    on_slices: set[tuple[int, int, int, str, Holder]] = set()
    on_gpus: set[tuple[int, str, str, Holder]] = set()
    for device_id, holder in holders.items():
        uuid, _, replica = device_id.partition("::")
        if holder.kind != "pod":  # a DRA claim is no pod: its devices count only as in use
            continue
        if uuid in slices:
            gpu, gi_id, ci_id = slices[uuid]
            on_slices.add((gpu, gi_id, ci_id, uuid, holder))
        elif uuid in gpus:
            on_gpus.add((gpus[uuid], uuid, replica, holder))
    return Attribution(sorted(on_slices), sorted(on_gpus, key=_replica_order))


class PodCollector:
    name = "pods"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot
        if snap is None:
            return
        slices = GaugeMetricFamily(
            "nodeagent_slice_pod_info",
            "The container holding a MIG slice (kubelet pod-resources); value 1. Join on gpu,"
            " gi_id, ci_id.",
            labels=["gpu", "gi_id", "ci_id", "mig_uuid", "namespace", "pod", "container"],
        )
        gpus = GaugeMetricFamily(
            "nodeagent_gpu_pod_info",
            "The container holding a GPU (replica '') or one of its MPS / time-slicing replicas"
            " (<uuid>::<n>, replica 'n'; kubelet pod-resources); value 1. Join on gpu.",
            labels=["gpu", "uuid", "replica", "namespace", "pod", "container"],
        )
        found = attribute(snap.inventory, snap.holders)
        for gpu, gi_id, ci_id, mig_uuid, h in found.slices:
            who = [h.namespace, h.pod, h.container]
            slices.add_metric([str(gpu), str(gi_id), str(ci_id), mig_uuid, *who], 1)
        for gpu, uuid, replica, h in found.gpus:
            gpus.add_metric([str(gpu), uuid, replica, h.namespace, h.pod, h.container], 1)
        yield from (slices, gpus)
