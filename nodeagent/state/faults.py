"""Which GPUs and MIG slices are faulty now, from what the health sampler reads: XID events,
uncorrected ECC counters, row remapping and the driver's recovery action. Clocks are injected;
nothing here calls NVML.

A fault is one of these kinds, on a whole GPU or on one MIG slice (a profile at a placement,
so a GI id NVML reuses for a new slice never inherits an old slice's fault):

    xid-<code>          an XID event; NVML names the GPU instance when it hit one slice
    ecc-uncorrected     an uncorrected ECC counter (volatile or aggregate) went up
    row-remap-pending   a row remap waits for a GPU reset (a flag NVML keeps until then)
    row-remap-failure   a row remap failed (the GPU needs service)
    recovery-<action>   the driver asks for a recovery action (recovery-gpu-reset,
                        recovery-node-reboot, ...: nodeagent.state.recovery) until it is done

An event (an XID, a counter going up) keeps its fault for `hold_seconds` after it was last seen,
and an XID after which the GPU needs a reset or a reboot keeps it longer: until the recovery
ran. Where the driver reports its recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), the
driver decides: an XID's fault clears once the hold has passed and the driver, asked after the
XID, reads NONE. Where it does not, NVIDIA's Xid catalog decides (nodeagent.state.recovery): a
reset-class XID's fault waits for a sign that the GPU was reset (a pending row remap done, or a
volatile ECC counter restarting), a reboot-class one for the node's next boot (the fault log,
nodeagent.state.faultlog keeps both across agent restarts). A reset- or reboot-class XID is
a fault of the whole GPU even where NVML names the slice it hit: the reset is the GPU's. A flag
keeps its fault while it is set. Application XIDs (NVIDIA's device plugin ignores the same ones:
an illegal address, a kernel killed, a watchdog of the application's own) are no fault of the
GPU's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from nodeagent.nvml.health import Health
from nodeagent.settings import groups
from nodeagent.state.faultlog import FaultLog, Waiting
from nodeagent.state.recovery import (
    HOLD,
    NONE,
    REBOOT,
    RECOVERY_PREFIX,
    RESET,
    action_kind,
    xid_waits_for,
)

Clock = Callable[[], float]
APPLICATION_XIDS: frozenset[int] = frozenset(groups.APPLICATION_XIDS)
ECC = "ecc-uncorrected"
REMAP_PENDING = "row-remap-pending"
REMAP_FAILURE = "row-remap-failure"
KINDS = ("xid", "xid-<code>", ECC, REMAP_PENDING, REMAP_FAILURE)  # what settings may name
_RANK = {HOLD: 0, RESET: 1, REBOOT: 2}


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


@dataclass(frozen=True)
class _Event:
    last: float  # monotonic
    first: float  # wall
    seen: int  # the tracker's read serial when last seen
    waits_for: str = HOLD  # by the catalog: HOLD, RESET or REBOOT


def xid_kind(code: int) -> str:
    return f"xid-{code}"


class FaultTracker:
    """Faults by device, fed by the health sampler (under the NVML lock) and read by the DRA
    driver (from its own worker): its own lock keeps the two apart. With a `faultlog`, the faults
    that wait for a reset or a reboot outlive the process (for this boot)."""

    def __init__(
        self, clock: Clock = time.monotonic, wall: Clock = time.time,
        faultlog: FaultLog | None = None,
    ) -> None:  # fmt: skip
        self.clock = clock
        self.wall = wall
        self.faultlog = faultlog
        self._lock = threading.Lock()
        self._serial = 0  # counts the events and reads, to order them
        self._events: dict[tuple[FaultKey, str], _Event] = {}
        self._flags: dict[tuple[FaultKey, str], float] = {}  # first seen (wall)
        self._counters: dict[tuple[FaultKey, str], int] = {}  # the last ECC count by scope
        self._actions: dict[int, tuple[int, int]] = {}  # GPU -> (recovery action, serial read)
        self._reset: dict[int, int] = {}  # GPU -> the serial of its last sign of a reset
        self._saved: list[Waiting] = []
        if faultlog is not None:
            self._saved = faultlog.load()
            if faultlog.stale:  # of another boot, or unreadable: say so in the file too
                faultlog.save(self._saved)
            for w in self._saved:  # their hold starts again now
                self._events[(FaultKey(w.gpu), w.kind)] = _Event(
                    self.clock(), w.since, 0, w.waits_for
                )

    def _tick(self) -> int:
        self._serial += 1
        return self._serial

    def _event(self, key: FaultKey, kind: str, waits_for: str = HOLD) -> None:
        now, wall = self.clock(), self.wall()
        old = self._events.get((key, kind))
        if old is not None and _RANK[old.waits_for] > _RANK[waits_for]:
            waits_for = old.waits_for
        first = old.first if old is not None else wall
        self._events[(key, kind)] = _Event(now, first, self._tick(), waits_for)

    def xid(self, key: FaultKey, code: int) -> None:
        """An XID event of `key` now."""
        waits_for = xid_waits_for(code)
        if waits_for != HOLD:
            key = FaultKey(key.gpu)  # the reset (or reboot) is the whole GPU's
        with self._lock:
            self._event(key, xid_kind(code), waits_for)
            self._save()

    def health(self, key: FaultKey, health: Health) -> None:
        """One read of `key`'s counters: an uncorrected ECC count above the last read is an
        event (the first read only sets the baseline: errors from before the agent started
        are not news; a volatile count below it is a sign of a GPU reset); the row-remap flags
        hold their fault while set (one cleared: a sign of a reset), and so does a recovery
        action other than NONE (the driver reading NONE again: the recovery ran)."""
        with self._lock:
            serial = self._tick()
            for (severity, scope), count in health.ecc_errors.items():
                if severity != "uncorrected":
                    continue
                last = self._counters.get((key, scope))
                self._counters[(key, scope)] = count
                if last is not None and count > last:
                    self._event(key, ECC)
                elif last is not None and count < last and scope == "volatile":
                    self._reset[key.gpu] = serial
            if (key, REMAP_PENDING) in self._flags and health.row_remap_pending is False:
                self._reset[key.gpu] = serial
            for kind, flag in (
                (REMAP_PENDING, health.row_remap_pending),
                (REMAP_FAILURE, health.row_remap_failure),
            ):
                if flag:
                    self._flags.setdefault((key, kind), self.wall())
                else:
                    self._flags.pop((key, kind), None)
            if not key.is_slice and health.recovery_action is not None:
                self._recovery(key, health.recovery_action, serial)

    def _recovery(self, key: FaultKey, action: int, serial: int) -> None:
        old = self._actions.get(key.gpu)
        self._actions[key.gpu] = (action, serial)
        if old is not None and old[0] != NONE and action == NONE:
            self._reset[key.gpu] = serial
        wanted = None if action == NONE else action_kind(action)
        for k in [k for k in self._flags if k[0] == key and k[1].startswith(RECOVERY_PREFIX)]:
            if k[1] != wanted:
                del self._flags[k]
        if wanted is not None:
            self._flags.setdefault((key, wanted), self.wall())

    def forget(self, keep: Collection[FaultKey]) -> None:
        """Drop what is known of devices not in `keep` (a slice destroyed, a GPU gone): a new
        slice at the same placement starts healthy, with its own counter baseline."""
        with self._lock:
            for table in (self._events, self._flags, self._counters):
                for k in [k for k in table if k[0] not in keep]:
                    del table[k]
            self._save()

    def active(self, policy: FaultPolicy) -> dict[FaultKey, Fault]:
        """Every device with a fault now; an event older than the policy's hold is dropped
        unless it waits for a recovery that has not run."""
        now = self.clock()
        found: dict[FaultKey, list[tuple[str, float]]] = {}
        with self._lock:
            for (key, kind), event in list(self._events.items()):
                if now - event.last >= policy.hold_seconds and self._recovered(key.gpu, event):
                    del self._events[(key, kind)]
                elif not _ignored(kind, policy.ignored_xids):
                    found.setdefault(key, []).append((kind, event.first))
            for (key, kind), first in self._flags.items():
                found.setdefault(key, []).append((kind, first))
            self._save()
        return {
            key: Fault(tuple(sorted(k for k, _ in kinds)), min(t for _, t in kinds))
            for key, kinds in sorted(found.items(), key=lambda item: _order(item[0]))
        }

    def _recovered(self, gpu: int, event: _Event) -> bool:
        """Whether what `event` waits for has happened: the driver, asked since the event, reads
        no recovery action; else (a driver without the field, or one that could not answer
        since, as a GPU fallen off the bus) by the catalog: nothing, a sign of a GPU reset since
        the event, or a reboot (never within this boot)."""
        read = self._actions.get(gpu)
        if read is not None and read[1] > event.seen:
            return read[0] == NONE
        if event.waits_for == HOLD:
            return True
        return event.waits_for == RESET and self._reset.get(gpu, -1) > event.seen

    def _save(self) -> None:
        """Write the fault log when the faults that wait for a recovery changed."""
        if self.faultlog is None:
            return
        waiting = sorted(
            (
                Waiting(key.gpu, kind, event.first, event.waits_for)
                for (key, kind), event in self._events.items()
                if event.waits_for != HOLD
            ),
            key=lambda w: (w.gpu, w.kind),
        )
        if waiting != self._saved:
            self.faultlog.save(waiting)
            self._saved = waiting


def _order(key: FaultKey) -> tuple[int, int, int]:
    """A GPU before its slices (FaultKey's own order cannot compare None with a number)."""
    return (key.gpu, -1 if key.profile_id is None else key.profile_id, key.start or 0)


def _ignored(kind: str, ignored_xids: frozenset[int]) -> bool:
    return kind.startswith("xid-") and int(kind[4:]) in ignored_xids


def fatal(kinds: Collection[str], fatal_kinds: Collection[str]) -> bool:
    """Whether any of `kinds` is named fatal: by its kind, `xid` for every XID, or `recovery`
    for every recovery action the driver reports."""
    return any(
        k in fatal_kinds
        or (k.startswith("xid-") and "xid" in fatal_kinds)
        or (k.startswith(RECOVERY_PREFIX) and "recovery" in fatal_kinds)
        for k in kinds
    )
