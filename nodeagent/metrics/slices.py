"""Per-slice series (one per MIG device), GPM per GPU instance, free/used slices per profile."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.metrics.gpus import GPM_HELP
from nodeagent.state.snapshot import Store

KEYS = ["gpu", "gi_id", "ci_id"]


class SliceCollector:
    name = "slices"

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot
        if snap is None:
            return
        inventory = snap.inventory
        info = GaugeMetricFamily(
            "nodeagent_slice_info",
            "MIG slice identity; value 1. Join value series on gpu, gi_id, ci_id.",
            labels=["gpu", "uuid", "mig_uuid", "gi_id", "ci_id", "profile", "placement"],
        )
        total = GaugeMetricFamily(
            "nodeagent_slice_memory_total_bytes", "Slice memory.", labels=KEYS
        )
        used = GaugeMetricFamily(
            "nodeagent_slice_memory_used_bytes", "Slice memory in use.", labels=KEYS
        )
        sms = GaugeMetricFamily("nodeagent_slice_multiprocessors", "SMs of the slice.", labels=KEYS)
        procs = GaugeMetricFamily(
            "nodeagent_slice_processes", "Processes on the slice.", labels=KEYS
        )
        gpm = {
            k: GaugeMetricFamily(
                f"nodeagent_slice_{k}_ratio", h + " Per GPU instance.", labels=["gpu", "gi_id"]
            )
            for k, h in GPM_HELP.items()
        }
        counts = GaugeMetricFamily(
            "nodeagent_gpu_slices",
            "Slices per profile: used (a process runs on it or a pod was allocated it), free, or"
            " incomplete (a GPU instance without its compute instance: not usable).",
            labels=["gpu", "profile", "state"],
        )
        ratios, allocated = self.store.gpm.by_gi, snap.allocated
        for gpu in inventory.gpus:
            g = str(gpu.index)
            tally: dict[tuple[str, str], int] = {}
            seen_gi: set[int] = set()
            for s in gpu.slices:
                ci = "" if s.ci_id is None else str(s.ci_id)
                keys = [g, str(s.gi_id), ci]
                info.add_metric(
                    [g, gpu.uuid, s.mig_uuid or "", str(s.gi_id), ci, s.profile, str(s.placement)],
                    1,
                )
                total.add_metric(keys, s.memory_total_bytes)
                used.add_metric(keys, s.memory_used_bytes)
                sms.add_metric(keys, s.multiprocessor_count)
                procs.add_metric(keys, len(s.processes))
                held = s.mig_uuid is not None and s.mig_uuid in allocated
                state = "incomplete" if s.ci_id is None else "used" if s.in_use or held else "free"
                tally[(s.profile, state)] = tally.get((s.profile, state), 0) + 1
                if s.gi_id not in seen_gi:
                    seen_gi.add(s.gi_id)
                    for k, v in ratios.get((gpu.index, s.gi_id), {}).items():
                        gpm[k].add_metric([g, str(s.gi_id)], v)
            for profile in sorted({s.profile for s in gpu.slices}):
                for state in ("free", "used"):
                    counts.add_metric([g, profile, state], tally.get((profile, state), 0))
                if (profile, "incomplete") in tally:
                    counts.add_metric([g, profile, "incomplete"], tally[(profile, "incomplete")])
        yield from (info, total, used, sms, procs, *gpm.values(), counts)
