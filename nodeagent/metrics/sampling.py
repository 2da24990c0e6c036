"""Sampling off the scrape path: the inventory refresher and the GPM sampler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from nodeagent.errors import AgentError
from nodeagent.metrics.store import GpmValues, Store, Telemetry
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.gpm import GpmReader, read_utilization

log = structlog.get_logger("nodeagent.metrics")
Clock = Callable[[], float]
MIN_GPM_WINDOW_SECONDS = 0.1


def refresh_inventory(session: NvmlSession, store: Store, clock: Clock) -> None:
    """Read the inventory (and utilization where NVML gives it) into the store."""
    inventory = read_inventory(session)
    util = {
        g.index: None if g.mig_current else read_utilization(session, g.index)
        for g in inventory.gpus
    }
    store.publish(inventory, Telemetry(util), clock())


class GpmSampler:
    """Keeps one GPM sample per GPU and per GPU instance; each tick takes a new one and, when
    the previous is at least 100 ms old, publishes the activity between the two.

    A GI is identified by (gpu, gi id, profile, placement, MIG UUID): when a GI id is reused for
    a new slice, its old sample is dropped (reseeded), never compared across slices.
    """

    def __init__(self, reader: GpmReader, store: Store, clock: Clock) -> None:
        self.reader = reader
        self.store = store
        self.clock = clock
        self._samples: dict[tuple[Any, ...], tuple[float, Any]] = {}
        self._values: dict[tuple[Any, ...], dict[str, float]] = {}
        self._supported: dict[int, bool] = {}

    def _keys(self) -> list[tuple[Any, ...]]:
        inventory = self.store.inventory
        keys: list[tuple[Any, ...]] = []
        if inventory is None:
            return keys
        for gpu in inventory.gpus:
            if gpu.index not in self._supported:
                self._supported[gpu.index] = self.reader.supported(gpu.index)
            if not self._supported[gpu.index]:
                continue
            keys.append(("gpu", gpu.index))
            seen = set()
            for s in gpu.slices:
                if s.gi_id not in seen:
                    seen.add(s.gi_id)
                    keys.append(
                        ("gi", gpu.index, s.gi_id, s.profile_id, str(s.placement), s.mig_uuid)
                    )
        return keys

    def tick(self) -> None:
        """Sample every GPU and GI once; publish new ratios. Raises NvmlError on a GPU fault."""
        keys = self._keys()
        for gone in set(self._samples) - set(keys):
            self.reader.free(self._samples.pop(gone)[1])
            self._values.pop(gone, None)
        for key in keys:
            now = self.clock()
            sample = self.reader.sample(key[1], None if key[0] == "gpu" else key[2])
            previous = self._samples.get(key)
            if previous is not None and now - previous[0] < MIN_GPM_WINDOW_SECONDS:
                self.reader.free(sample)
                continue
            if previous is not None:
                self._values[key] = self.reader.ratios(previous[1], sample)
                self.reader.free(previous[1])
            self._samples[key] = (now, sample)
        self.store.gpm = GpmValues(
            by_gpu={k[1]: v for k, v in self._values.items() if k[0] == "gpu"},
            by_gi={(k[1], k[2]): v for k, v in self._values.items() if k[0] == "gi"},
        )

    def close(self) -> None:
        for _, sample in self._samples.values():
            self.reader.free(sample)
        self._samples.clear()


class Periodic(threading.Thread):
    """Runs `work` every `interval_seconds` until stopped; logs and counts failures."""

    def __init__(
        self,
        name: str,
        work: Callable[[], None],
        interval_seconds: float,
        stop: threading.Event,
        wait_first: bool = False,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.wait_first = wait_first
        self.work = work
        self.interval = interval_seconds
        self.stop_event = stop
        self.failures = 0
        self.last_ok: float | None = None

    def run(self) -> None:
        if self.wait_first:
            self.stop_event.wait(self.interval)
        while not self.stop_event.is_set():
            try:
                self.work()
                self.failures = 0
            except AgentError as err:
                self.failures += 1
                log.warning("sampler.failed", sampler=self.name, error=str(err))
            self.stop_event.wait(self.interval)
