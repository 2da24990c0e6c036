"""Per-GPU series: identity, memory, MIG mode, utilization, GPM activity."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.state.snapshot import Store

GPM_HELP = {
    "graphics_active": "Share of time the graphics engine was busy (GPM GRAPHICS_UTIL).",
    "sm_active": "Share of SM time busy (GPM SM_UTIL).",
    "sm_occupancy": "Share of warp slots occupied (GPM SM_OCCUPANCY).",
    "tensor_active": "Share of time tensor cores were busy (GPM ANY_TENSOR_UTIL).",
    "dram_active": "Share of DRAM bandwidth used (GPM DRAM_BW_UTIL).",
}


class GpuCollector:
    name = "gpus"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot
        if snap is None:
            return
        inventory = snap.inventory
        info = GaugeMetricFamily(
            "nodeagent_gpu_info",
            "GPU identity; value 1.",
            labels=["gpu", "uuid", "name", "driver_version", "pci_bus_id"],
        )
        total = GaugeMetricFamily("nodeagent_gpu_memory_total_bytes", "GPU memory.", labels=["gpu"])
        used = GaugeMetricFamily(
            "nodeagent_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"]
        )
        free = GaugeMetricFamily(
            "nodeagent_gpu_memory_free_bytes", "GPU memory free.", labels=["gpu"]
        )
        mig = GaugeMetricFamily(
            "nodeagent_gpu_mig_enabled",
            "1 if MIG mode is enabled; state is current or pending (after the next reset).",
            labels=["gpu", "state"],
        )
        util = GaugeMetricFamily(
            "nodeagent_gpu_utilization_ratio",
            "Share of time a kernel ran (NVML utilization; absent on MIG GPUs).",
            labels=["gpu"],
        )
        gpm = {
            k: GaugeMetricFamily(f"nodeagent_gpu_{k}_ratio", h, labels=["gpu"])
            for k, h in GPM_HELP.items()
        }
        telemetry, ratios = snap.telemetry, self.store.gpm.by_gpu
        for gpu in inventory.gpus:
            g = str(gpu.index)
            info.add_metric([g, gpu.uuid, gpu.name, inventory.driver_version, gpu.pci_bus_id], 1)
            total.add_metric([g], gpu.memory_total_bytes)
            used.add_metric([g], gpu.memory_used_bytes)
            free.add_metric([g], gpu.memory_free_bytes)
            if gpu.mig_capable:
                mig.add_metric([g, "current"], float(gpu.mig_current))
                mig.add_metric([g, "pending"], float(gpu.mig_pending))
            value = telemetry.utilization.get(gpu.index)
            if value is not None:
                util.add_metric([g], value)
            for k, v in ratios.get(gpu.index, {}).items():
                gpm[k].add_metric([g], v)
        yield from (info, total, used, free, mig, util, *gpm.values())
