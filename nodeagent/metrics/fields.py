"""Per-GPU series of the field-value sampler: memory temperature, memory-copy, encoder and
decoder utilization, reserved framebuffer, NVLink and PCIe traffic, remapped rows.

A value the GPU does not give has no series (never a 0). Values come from the field sampler
(run by the refresh worker) and the snapshot; a scrape calls no NVML.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodeagent.state.snapshot import FieldValues, Store


class FieldCollector:
    name = "fields"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot  # the memory-copy utilization is read with the inventory
        copy = {} if snap is None else snap.telemetry.memory_utilization
        yield from _families(copy, self.store.fields)


def _families(copy_ratios: Mapping[int, float | None], fields: FieldValues) -> list[Metric]:
    """The field families, each with a series per GPU that gives the value."""
    memory_temperature = GaugeMetricFamily(
        "nodeagent_gpu_memory_temperature_celsius",
        "GPU memory (HBM) temperature (NVML field MEMORY_TEMP).",
        labels=["gpu"],
    )
    copy = GaugeMetricFamily(
        "nodeagent_gpu_memory_copy_utilization_ratio",
        "Share of time GPU memory was read or written (NVML utilization; absent on MIG GPUs).",
        labels=["gpu"],
    )
    engines = GaugeMetricFamily(
        "nodeagent_gpu_engine_utilization_ratio",
        "Share of time the video encoder or decoder was busy (nvmlDeviceGetEncoder/"
        "DecoderUtilization; absent on MIG GPUs).",
        labels=["gpu", "engine"],
    )
    reserved = GaugeMetricFamily(
        "nodeagent_gpu_memory_reserved_bytes",
        "GPU memory the driver and firmware reserve (nvmlDeviceGetMemoryInfo_v2).",
        labels=["gpu"],
    )
    nvlink = CounterMetricFamily(
        "nodeagent_gpu_nvlink_bytes",
        "NVLink traffic over all links since the driver loaded, protocol headers included"
        " (NVML field NVLINK_THROUGHPUT_RAW_TX/RX).",
        labels=["gpu", "direction"],
    )
    pcie = CounterMetricFamily(
        "nodeagent_gpu_pcie_bytes",
        "PCIe traffic since the driver loaded (NVML field PCIE_COUNT_TX/RX_BYTES).",
        labels=["gpu", "direction"],
    )
    remapped = CounterMetricFamily(
        "nodeagent_gpu_remapped_rows",
        "Memory rows remapped, by the kind of error that caused it (NVML field REMAPPED_COR/UNC).",
        labels=["gpu", "cause"],
    )
    for index, memory_ratio in sorted(copy_ratios.items()):
        if memory_ratio is not None:
            copy.add_metric([str(index)], memory_ratio)
    for index, f in sorted(fields.by_gpu.items()):
        g = str(index)
        if f.memory_temperature_celsius is not None:
            memory_temperature.add_metric([g], f.memory_temperature_celsius)
        for engine, ratio in (
            ("encoder", f.encoder_utilization),
            ("decoder", f.decoder_utilization),
        ):
            if ratio is not None:
                engines.add_metric([g, engine], ratio)
        if f.memory_reserved_bytes is not None:
            reserved.add_metric([g], f.memory_reserved_bytes)
        for family, tx, rx in (
            (nvlink, f.nvlink_tx_bytes, f.nvlink_rx_bytes),
            (pcie, f.pcie_tx_bytes, f.pcie_rx_bytes),
        ):
            if tx is not None:
                family.add_metric([g, "tx"], tx)
            if rx is not None:
                family.add_metric([g, "rx"], rx)
        for cause, rows in (
            ("correctable", f.remapped_rows_correctable),
            ("uncorrectable", f.remapped_rows_uncorrectable),
        ):
            if rows is not None:
                remapped.add_metric([g, cause], rows)
    return [memory_temperature, copy, engines, reserved, nvlink, pcie, remapped]
