"""GPU health series: temperature, power, energy, clocks, clock throttle reasons, XIDs, ECC, row
remapping, PCIe replays; per MIG slice what NVML reports per MIG device.

A read the GPU does not support has no series (never a 0). Values come from the health
sampler (run by the refresh worker); a scrape calls no NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodeagent.state.snapshot import THROTTLE_REASONS, Health, HealthValues

# XIDs that NVIDIA's XID catalogue says need a GPU reset or a node reboot (48 double-bit ECC,
# 63/64 row remapping, 74 NVLink, 79 fell off the bus, 94/95 contained/uncontained ECC, 119/120
# GSP): their counters start at 0 on every watched GPU, so `increase()` sees the first one.
RESET_XIDS = (48, 63, 64, 74, 79, 94, 95, 119, 120)


class _Families:
    """The health families for one key set: `gpu`, or `gpu, gi_id, ci_id` for slices."""

    def __init__(self, prefix: str, keys: list[str]) -> None:
        def gauge(name: str, text: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{prefix}_{name}", text, labels=[*keys, *extra])

        def counter(name: str, text: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(f"{prefix}_{name}", text, labels=[*keys, *extra])

        self.temperature = gauge(
            "temperature_celsius", "GPU temperature (nvmlDeviceGetTemperature)."
        )
        self.power = gauge("power_watts", "Power draw (nvmlDeviceGetPowerUsage).")
        self.limit = gauge(
            "power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)."
        )
        self.energy = counter(
            "energy_joules",
            "Energy used since the driver loaded (nvmlDeviceGetTotalEnergyConsumption).",
        )
        self.clock = gauge("clock_hertz", "Current clock (nvmlDeviceGetClockInfo).", ("clock",))
        self.throttle = gauge(
            "clock_throttle",
            "1 if the reason holds the clocks down now (nvmlDeviceGetCurrentClocksEventReasons).",
            ("reason",),
        )
        self.ecc = counter(
            "ecc_errors",
            "ECC errors (nvmlDeviceGetTotalEccErrors); scope volatile: since the driver loaded,"
            " aggregate: over the GPU's life.",
            ("severity", "scope"),
        )
        self.remap_pending = gauge(
            "row_remap_pending",
            "1 if a row remap waits for a GPU reset (nvmlDeviceGetRemappedRows).",
        )
        self.remap_failure = gauge(
            "row_remap_failure", "1 if a row remap failed (nvmlDeviceGetRemappedRows)."
        )
        self.replays = counter("pcie_replay", "PCIe replays (nvmlDeviceGetPcieReplayCounter).")

    def add(self, keys: list[str], h: Health) -> None:
        if h.temperature_celsius is not None:
            self.temperature.add_metric(keys, h.temperature_celsius)
        if h.power_watts is not None:
            self.power.add_metric(keys, h.power_watts)
        if h.power_limit_watts is not None:
            self.limit.add_metric(keys, h.power_limit_watts)
        if h.energy_joules is not None:
            self.energy.add_metric(keys, h.energy_joules)
        if h.sm_clock_hertz is not None:
            self.clock.add_metric([*keys, "sm"], h.sm_clock_hertz)
        if h.memory_clock_hertz is not None:
            self.clock.add_metric([*keys, "memory"], h.memory_clock_hertz)
        if h.throttle is not None:
            for reason, _bit in THROTTLE_REASONS:
                self.throttle.add_metric([*keys, reason], float(h.throttle.get(reason, False)))
        for (severity, scope), count in h.ecc_errors.items():
            self.ecc.add_metric([*keys, severity, scope], count)
        if h.row_remap_pending is not None:
            self.remap_pending.add_metric(keys, float(h.row_remap_pending))
        if h.row_remap_failure is not None:
            self.remap_failure.add_metric(keys, float(h.row_remap_failure))
        if h.pcie_replays is not None:
            self.replays.add_metric(keys, h.pcie_replays)

    def families(self) -> list[Metric]:
        return [
            self.temperature,
            self.power,
            self.limit,
            self.energy,
            self.clock,
            self.throttle,
            self.ecc,
            self.remap_pending,
            self.remap_failure,
            self.replays,
        ]


class HealthCollector:
    name = "health"

    def __init__(self, values: Callable[[], HealthValues]) -> None:
        self.values = values

    def collect(self) -> Iterator[Metric]:
        values = self.values()
        gpus = _Families("nodeagent_gpu", ["gpu"])
        slices = _Families("nodeagent_slice", ["gpu", "gi_id", "ci_id"])
        for index, health in sorted(values.by_gpu.items()):
            gpus.add([str(index)], health)
        for (index, gi_id, ci_id), health in sorted(values.by_slice.items()):
            slices.add([str(index), str(gi_id), str(ci_id)], health)
        xids = CounterMetricFamily(
            "nodeagent_gpu_xid_errors",
            "XID critical errors since the agent started, by XID code (NVML event set).",
            labels=["gpu", "xid"],
        )
        last = GaugeMetricFamily(
            "nodeagent_gpu_last_xid",
            "The last XID code since the agent started; 0: none (NVML event set).",
            labels=["gpu"],
        )
        for index, counts in sorted(values.xid_counts.items()):
            g = str(index)
            for xid in sorted({*RESET_XIDS, *counts}):
                xids.add_metric([g, str(xid)], counts.get(xid, 0))
            last.add_metric([g], values.last_xid.get(index, 0))
        # GPU families always (dashboards find their names); a slice family only where a MIG
        # device reports that value.
        yield from gpus.families()
        yield xids
        yield last
        yield from (f for f in slices.families() if f.samples)
