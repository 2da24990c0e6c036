"""Which GPUs and MIG slices are faulty now, from what the health sampler reads: XID events,
uncorrected ECC counters and row remapping. Clocks are injected; nothing here calls NVML.

A fault is one of these kinds, on a whole GPU or on one MIG slice (a profile at a placement,
so a GI id NVML reuses for a new slice never inherits an old slice's fault):

    xid-<code>          an XID event; NVML names the GPU instance when it hit one slice
    ecc-uncorrected     an uncorrected ECC counter (volatile or aggregate) went up
    row-remap-pending   a row remap waits for a GPU reset (a flag NVML keeps until then)
    row-remap-failure   a row remap failed (the GPU needs service)

An event (an XID, a counter going up) keeps its fault for `hold_seconds` after it was last seen:
the device is healthy again after that long without a new one. A flag keeps its fault while it
is set. Application XIDs (NVIDIA's device plugin ignores the same ones: an illegal address, a
kernel killed, a watchdog of the application's own) are no fault of the GPU's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from nodeagent.nvml.health import Health
from nodeagent.settings import groups

Clock = Callable[[], float]
APPLICATION_XIDS: frozenset[int] = frozenset(groups.APPLICATION_XIDS)
ECC = "ecc-uncorrected"
REMAP_PENDING = "row-remap-pending"
REMAP_FAILURE = "row-remap-failure"
KINDS = ("xid", "xid-<code>", ECC, REMAP_PENDING, REMAP_FAILURE)  # what settings may name


@dataclass(frozen=True, order=True)
class FaultKey:
    """A whole GPU, or one MIG slice of it: its GI profile id at its placement start."""

    gpu: int
    profile_id: int | None = None
    start: int | None = None

    @property
    def is_slice(self) -> bool:
        return self.profile_id is not None


@dataclass(frozen=True)
class Fault:
    """The kinds of fault a device has now (sorted) and the wall time the oldest of them was
    first seen."""

    kinds: tuple[str, ...]
    since: float


@dataclass(frozen=True)
class FaultPolicy:
    hold_seconds: float = 60.0
    ignored_xids: frozenset[int] = APPLICATION_XIDS


def xid_kind(code: int) -> str:
    return f"xid-{code}"


class FaultTracker:
    """Faults by device, fed by the health sampler (under the NVML lock) and read by the DRA
    driver (from its own worker): its own lock keeps the two apart."""

    def __init__(self, clock: Clock = time.monotonic, wall: Clock = time.time) -> None:
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._events: dict[tuple[FaultKey, str], tuple[float, float]] = {}  # last, first (wall)
        self._flags: dict[tuple[FaultKey, str], float] = {}  # first seen (wall)
        self._counters: dict[tuple[FaultKey, str], int] = {}  # the last ECC count by scope

    def _event(self, key: FaultKey, kind: str) -> None:
        now, wall = self.clock(), self.wall()
        old = self._events.get((key, kind))
        self._events[(key, kind)] = (now, old[1] if old is not None else wall)

    def xid(self, key: FaultKey, code: int) -> None:
        """An XID event of `key` now."""
        with self._lock:
            self._event(key, xid_kind(code))

    def health(self, key: FaultKey, health: Health) -> None:
        """One read of `key`'s counters: an uncorrected ECC count above the last read is an
        event (the first read only sets the baseline: errors from before the agent started
        are not news); the row-remap flags hold their fault while set."""
        with self._lock:
            for (severity, scope), count in health.ecc_errors.items():
                if severity != "uncorrected":
                    continue
                last = self._counters.get((key, scope))
                self._counters[(key, scope)] = count
                if last is not None and count > last:
                    self._event(key, ECC)
            for kind, flag in (
                (REMAP_PENDING, health.row_remap_pending),
                (REMAP_FAILURE, health.row_remap_failure),
            ):
                if flag:
                    self._flags.setdefault((key, kind), self.wall())
                else:
                    self._flags.pop((key, kind), None)

    def forget(self, keep: Collection[FaultKey]) -> None:
        """Drop what is known of devices not in `keep` (a slice destroyed, a GPU gone): a new
        slice at the same placement starts healthy, with its own counter baseline."""
        with self._lock:
            for table in (self._events, self._flags, self._counters):
                for k in [k for k in table if k[0] not in keep]:
                    del table[k]

    def active(self, policy: FaultPolicy) -> dict[FaultKey, Fault]:
        """Every device with a fault now; an event older than the policy's hold is dropped."""
        now = self.clock()
        found: dict[FaultKey, list[tuple[str, float]]] = {}
        with self._lock:
            for (key, kind), (last, first) in list(self._events.items()):
                if now - last >= policy.hold_seconds:
                    del self._events[(key, kind)]
                elif not _ignored(kind, policy.ignored_xids):
                    found.setdefault(key, []).append((kind, first))
            for (key, kind), first in self._flags.items():
                found.setdefault(key, []).append((kind, first))
        return {
            key: Fault(tuple(sorted(k for k, _ in kinds)), min(t for _, t in kinds))
            for key, kinds in sorted(found.items())
        }


def _ignored(kind: str, ignored_xids: frozenset[int]) -> bool:
    return kind.startswith("xid-") and int(kind[4:]) in ignored_xids


def fatal(kinds: Collection[str], fatal_kinds: Collection[str]) -> bool:
    """Whether any of `kinds` is named fatal: by its kind, or `xid` for every XID."""
    return any(k in fatal_kinds or (k.startswith("xid-") and "xid" in fatal_kinds) for k in kinds)
