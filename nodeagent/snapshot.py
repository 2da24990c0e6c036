"""The one owner of what the agent knows about its GPUs: an immutable Snapshot.

Every reader (collectors, labels, the pipeline) takes `store.snapshot` once and works on that
object, so it never mixes two reads. A snapshot is replaced in one assignment, and only by a
newer read: each read takes its generation number under the NVML lock before it starts, so a
read that began before a MIG change can never publish the old geometry after it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nodeagent.errors import AgentError
from nodeagent.logs import get_logger
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.nvml.gpm import read_utilization

log = get_logger("nodeagent.snapshot")
Clock = Callable[[], float]
Allocations = Callable[[], Mapping[str, str]]


@dataclass(frozen=True)
class Telemetry:
    """Per-GPU values read with the inventory that are not part of it."""

    utilization: Mapping[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class GpmValues:
    """GPM ratios (0-1) by metric name, per GPU and per (GPU, GPU instance id)."""

    by_gpu: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    by_gi: Mapping[tuple[int, int], Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One read of the node: GPUs, their telemetry, which devices pods hold (kubelet)."""

    inventory: Inventory
    telemetry: Telemetry
    allocated: Mapping[str, str]  # device UUID -> the pod holding it
    taken_at: float  # wall clock, when the read began
    generation: int


class Store:
    """Holds the latest Snapshot and GPM values; `observe()` is the only way to make one."""

    def __init__(self, session: NvmlSession, clock: Clock) -> None:
        self.session = session
        self.clock = clock
        self.snapshot: Snapshot | None = None
        self.gpm = GpmValues()
        self.dropped = 0  # reads that finished after a newer one and were not published
        self._generations = itertools.count(1)
        self._publish_lock = threading.Lock()

    def observe(self, allocations: Allocations | None = None) -> Snapshot:
        """Read every GPU (under the session's NVML lock), ask `allocations` which devices pods
        hold, and publish the result unless a newer read was published meanwhile. Returns the
        snapshot now published. Raises NvmlError; a failing `allocations` keeps the last answer."""
        with self.session.lock:
            generation = next(self._generations)
            taken_at = self.clock()
            inventory = read_inventory(self.session)
            utilization = {
                g.index: None if g.mig_current else read_utilization(self.session, g.index)
                for g in inventory.gpus
            }
        previous = self.snapshot
        allocated: Mapping[str, str] = previous.allocated if previous else {}
        if allocations is not None:
            try:
                allocated = allocations()
            except AgentError as err:  # metrics keep the last answer; changes still fail safe
                log.warning("podresources.failed", error=str(err))
        snap = Snapshot(inventory, Telemetry(utilization), allocated, taken_at, generation)
        return self.offer(snap)

    def offer(self, snap: Snapshot) -> Snapshot:
        """Publish `snap` if it is newer than the published one; return the published one."""
        with self._publish_lock:
            current = self.snapshot
            if current is not None and current.generation > snap.generation:
                self.dropped += 1
                log.debug("snapshot.dropped", generation=snap.generation, newer=current.generation)
                return current
            self.snapshot = snap
            return snap
