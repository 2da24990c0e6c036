"""Utilization without GPM (Ampere too): the GPU's memory utilization, and per process its SM,
memory, encoder and decoder utilization, with the slice and the pod each process runs on.

Processes are placed on devices by NVML (each GPU's and MIG device's running processes, in the
inventory) and devices on pods by the kubelet (pod-resources, metrics/pods.py): a process is
attributed to the container holding the device it runs on when exactly one container holds
that device (a whole GPU, a MIG slice); on a device shared by several containers (MPS or
time-slicing replicas) its pod labels are empty, as NVML does not say which container a pid
belongs to. NVML has no per-process utilization on MIG-enabled GPUs: processes on slices have
an info series and memory, no utilization series. Values come from the refresh worker's
sampler; a scrape calls no NVML.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.metrics.pods import attribute
from nodeagent.state.snapshot import Holder, ProcessUtilization, Snapshot, Store

ENGINES = {
    "sm": "Share of the driver's sample period the process kept SMs busy",
    "memory": "Share of the driver's sample period the process read or wrote device memory",
    "encoder": "Share of the driver's sample period the process used the video encoder",
    "decoder": "Share of the driver's sample period the process used the video decoder",
}
_WINDOW = (
    " (nvmlDeviceGetProcessUtilization: its newest sample since the last refresh; 0 for a"
    " running process with none; absent on MIG GPUs)."
)
_NOBODY = ("", "", "")

Device = tuple[str, str, str]  # gpu, gi_id, ci_id ("" and "" for a whole GPU)


def _holders(snap: Snapshot) -> dict[Device, tuple[str, str, str]]:
    """Each device held by exactly one container -> (namespace, pod, container)."""
    found = attribute(snap.inventory, snap.holders)
    by_device: dict[Device, set[Holder]] = {}
    for gpu, gi_id, ci_id, _, holder in found.slices:
        by_device.setdefault((str(gpu), str(gi_id), str(ci_id)), set()).add(holder)
    for gpu, _, _, holder in found.gpus:
        by_device.setdefault((str(gpu), "", ""), set()).add(holder)
    return {
        device: (h.namespace, h.pod, h.container)
        for device, held in by_device.items()
        if len(held) == 1
        for h in held
    }


def _placed(snap: Snapshot) -> list[tuple[Device, int, int | None]]:
    """Every running process once per GPU: (its device, pid, memory bytes or None), in the
    inventory's order (the GPU's own processes, then each slice's)."""
    placed: dict[tuple[str, int], tuple[Device, int, int | None]] = {}
    for gpu in snap.inventory.gpus:
        g = str(gpu.index)
        on = [((g, "", ""), p) for p in gpu.processes]
        on += [
            ((g, str(s.gi_id), str(s.ci_id)), p)
            for s in gpu.slices
            if s.ci_id is not None
            for p in s.processes
        ]
        for device, p in on:
            placed.setdefault((g, p.pid), (device, p.pid, p.memory_bytes))
    return list(placed.values())


class UtilizationCollector:
    name = "utilization"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> list[Metric]:
        snap = self.store.snapshot  # taken once, with the sampler's latest values
        return [] if snap is None else families(snap, self.store.utilization)


def families(snap: Snapshot, utilization: ProcessUtilization) -> list[Metric]:
    """Every family of this module for one snapshot and the sampler's latest values (the
    GPU's memory utilization is nodeagent_gpu_memory_copy_utilization_ratio, metrics/fields)."""
    return _process_families(snap, utilization)


def _process_families(snap: Snapshot, utilization: ProcessUtilization) -> list[Metric]:
    info = GaugeMetricFamily(
        "nodeagent_process_info",
        "A process on a GPU or MIG slice (gi_id, ci_id empty for a whole GPU) and the"
        " container holding that device when exactly one does (kubelet pod-resources);"
        " value 1. Join on gpu, pid.",
        labels=["gpu", "pid", "gi_id", "ci_id", "namespace", "pod", "container"],
    )
    memory = GaugeMetricFamily(
        "nodeagent_process_memory_used_bytes",
        "Device memory the process uses (nvmlDeviceGetComputeRunningProcesses; absent"
        " where NVML does not say).",
        labels=["gpu", "pid"],
    )
    rates = {
        k: GaugeMetricFamily(
            f"nodeagent_process_{k}_utilization_ratio", h + _WINDOW, labels=["gpu", "pid"]
        )
        for k, h in ENGINES.items()
    }
    holders = _holders(snap)
    seen: set[tuple[str, str]] = set()
    for device, pid, memory_bytes in _placed(snap):
        g, key = device[0], str(pid)
        seen.add((g, key))
        info.add_metric([g, key, *device[1:], *holders.get(device, _NOBODY)], 1)
        if memory_bytes is not None:
            memory.add_metric([g, key], memory_bytes)
    for index, samples in sorted(utilization.by_gpu.items()):
        g = str(index)
        for pid, sample in sorted(samples.items()):
            if (g, str(pid)) not in seen:  # sampled, not in the compute list (a graphics
                seen.add((g, str(pid)))  # process, or one that ended since the snapshot)
                info.add_metric([g, str(pid), "", "", *holders.get((g, "", ""), _NOBODY)], 1)
            for engine, value in (
                ("sm", sample.sm),
                ("memory", sample.memory),
                ("encoder", sample.encoder),
                ("decoder", sample.decoder),
            ):
                rates[engine].add_metric([g, str(pid)], value)
    return [info, memory, *rates.values()]
