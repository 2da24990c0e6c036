"""GPM and health sampling off the scrape path: the refresh and GPM workers read NVML here and
publish what they read through the snapshot store (its one owner), where the collectors of
nodeagent.metrics read it. metrics/ itself never calls NVML."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.base.logs import get_logger
from nodeagent.nvml import Inventory, NvmlSession
from nodeagent.nvml.codes import NOT_FOUND
from nodeagent.nvml.fields import DeviceFields, FieldReader
from nodeagent.nvml.gpm import GpmReader
from nodeagent.nvml.health import (
    Health,
    XidWatcher,
    mig_handle,
    read_fault_counters,
    read_health,
)
from nodeagent.nvml.inventory import Slice
from nodeagent.nvml.session import gpu_handle
from nodeagent.nvml.utilization import (
    MAX_SAMPLE_PERIOD_US,
    MpsClients,
    ProcessSample,
    ProcessUtilizationReader,
    idle_sample,
    read_mps_clients,
)
from nodeagent.state.faultlog import FaultLog
from nodeagent.state.faults import FaultKey, FaultTracker
from nodeagent.state.snapshot import FieldValues, GpmValues, HealthValues, ProcessUtilization, Store

Clock = Callable[[], float]
log = get_logger("nodeagent.state.sampling")
MIN_GPM_WINDOW_SECONDS = 0.1


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
        snap = self.store.snapshot
        keys: list[tuple[Any, ...]] = []
        if snap is None:
            return keys
        inventory = snap.inventory
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
        # Under the NVML lock: a MIG change never destroys a GI between listing and sampling it.
        with self.store.session.lock:
            keys = self._keys()
            for gone in set(self._samples) - set(keys):
                self.reader.free(self._samples.pop(gone)[1])
                self._values.pop(gone, None)
            for key in keys:
                self._sample(key)
        self.store.publish_gpm(
            GpmValues(
                by_gpu={k[1]: v for k, v in self._values.items() if k[0] == "gpu"},
                by_gi={(k[1], k[2]): v for k, v in self._values.items() if k[0] == "gi"},
            )
        )

    def _sample(self, key: tuple[Any, ...]) -> None:
        now = self.clock()
        try:
            sample = self.reader.sample(key[1], None if key[0] == "gpu" else key[2])
        except NvmlError as err:
            if key[0] == "gi" and err.code == NOT_FOUND:
                # Destroyed since the snapshot was taken (an apply, or `mig apply` by hand):
                # not an error; the next snapshot no longer lists it.
                old = self._samples.pop(key, None)
                if old is not None:
                    self.reader.free(old[1])
                self._values.pop(key, None)
                return
            raise
        previous = self._samples.get(key)
        if previous is not None and now - previous[0] < MIN_GPM_WINDOW_SECONDS:
            self.reader.free(sample)
            return
        if previous is not None:
            self._values[key] = self.reader.ratios(previous[1], sample)
            self.reader.free(previous[1])
        self._samples[key] = (now, sample)

    def close(self) -> None:
        for _, sample in self._samples.values():
            self.reader.free(sample)
        self._samples.clear()
        self.reader.close()


class HealthSampler:
    """Reads every GPU's and MIG device's health counters and drains the XID event set; run by
    the refresh worker after each new snapshot, never by a scrape. `poll_faults()` reads only
    what says a device is faulty (XIDs, uncorrected ECC, row remapping), for the DRA driver's
    taints at its own, shorter interval; both feed `faults`."""

    def __init__(
        self, session: NvmlSession, store: Store, clock: Clock = time.monotonic,
        wall: Clock = time.time, faultlog: FaultLog | None = None,
    ) -> None:  # fmt: skip
        self.session = session
        self.store = store
        self.xids = XidWatcher(session)
        self.faults = FaultTracker(clock, wall, faultlog)
        self._counts: dict[int, Counter[int]] = {}
        self._last: dict[int, int] = {}
        self._tried: set[int] = set()
        self._unsupported: dict[str, set[tuple[object, ...]]] = {}  # by GPU or MIG UUID
        self._fault_reads: dict[str, set[tuple[object, ...]]] = {}  # the same, of poll_faults

    def tick(self) -> None:
        """One read of everything; raises NvmlError on a GPU fault (the last values stay)."""
        snap = self.store.snapshot
        if snap is None:
            return
        by_gpu: dict[int, Health] = {}
        by_slice: dict[tuple[int, int, int], Health] = {}
        known = self._unsupported
        self._unsupported = {}  # of the devices that still exist

        def skip(uuid: str) -> set[tuple[object, ...]]:
            self._unsupported[uuid] = known.get(uuid, set())
            return self._unsupported[uuid]

        with self.session.lock:
            self._watch(snap.inventory)
            for gpu in snap.inventory.gpus:
                handle = gpu_handle(self.session, gpu.index)
                by_gpu[gpu.index] = read_health(self.session, handle, skip(gpu.uuid))
                self.faults.health(FaultKey(gpu.index), by_gpu[gpu.index])
                for s in gpu.slices:
                    if s.mig_uuid is None or s.ci_id is None:
                        continue
                    handle = mig_handle(self.session, s.mig_uuid)
                    if handle is not None:  # else destroyed since the snapshot
                        health = read_health(self.session, handle, skip(s.mig_uuid))
                        by_slice[(gpu.index, s.gi_id, s.ci_id)] = health
                        self.faults.health(_slice_key(s), health)
            self._drain(snap.inventory)
        self.store.publish_health(
            HealthValues(
                by_gpu=by_gpu,
                by_slice=by_slice,
                xid_counts={g: dict(c) for g, c in self._counts.items()},
                last_xid=dict(self._last),
            )
        )

    def poll_faults(self) -> None:
        """XIDs, uncorrected ECC counts, row-remap flags and the driver's recovery action of
        every GPU and MIG device into `faults` (4 NVML calls a device, 3 a MIG device once it
        answered the recovery action "not supported", and one a queued XID). The XIDs are
        drained before the reads, so a read speaks for the XIDs before it. Raises NvmlError
        on a GPU fault."""
        snap = self.store.snapshot
        if snap is None:
            return
        known, self._fault_reads = self._fault_reads, {}
        with self.session.lock:
            self._watch(snap.inventory)
            self._drain(snap.inventory)
            for gpu in snap.inventory.gpus:
                skip = self._fault_reads[gpu.uuid] = known.get(gpu.uuid, set())
                handle = gpu_handle(self.session, gpu.index)
                self.faults.health(
                    FaultKey(gpu.index), read_fault_counters(self.session, handle, skip)
                )
                for s in gpu.slices:
                    if s.mig_uuid is None or s.ci_id is None:
                        continue
                    handle = mig_handle(self.session, s.mig_uuid)
                    if handle is not None:
                        skip = self._fault_reads[s.mig_uuid] = known.get(s.mig_uuid, set())
                        health = read_fault_counters(self.session, handle, skip)
                        self.faults.health(_slice_key(s), health)
        self.faults.forget(_keys(snap.inventory))

    def _watch(self, inventory: Inventory) -> None:
        for gpu in inventory.gpus:
            if gpu.index not in self._tried:  # once: a GPU without XID events stays so
                self._tried.add(gpu.index)
                if self.xids.watch(gpu.index):
                    self._counts[gpu.index] = Counter()
                    self._last[gpu.index] = 0

    def _drain(self, inventory: Inventory) -> None:
        """The XIDs queued since the last drain: counted per GPU, and each a fault of the slice
        whose GPU instance NVML names (of the whole GPU when it names none, or one the snapshot
        does not know yet)."""
        slices = {(s.gpu_index, s.gi_id): s for g in inventory.gpus for s in g.slices}
        for event in self.xids.poll():
            if event.gpu in self._counts:
                self._counts[event.gpu][event.xid] += 1
                self._last[event.gpu] = event.xid
            hit = slices.get((event.gpu, event.gi_id)) if event.gi_id is not None else None
            self.faults.xid(FaultKey(event.gpu) if hit is None else _slice_key(hit), event.xid)
            log.warning("xid", gpu=event.gpu, xid=event.xid, gi=event.gi_id, ci=event.ci_id)

    def close(self) -> None:
        with self.session.lock:
            self.xids.close()


def _slice_key(s: Slice) -> FaultKey:
    return FaultKey(s.gpu_index, s.profile_id, s.placement.start)


def _keys(inventory: Inventory) -> set[FaultKey]:
    keys = {FaultKey(g.index) for g in inventory.gpus}
    return keys | {_slice_key(s) for g in inventory.gpus for s in g.slices}


class FieldSampler:
    """Reads every GPU's field values (one nvmlDeviceGetFieldValues call per GPU) and engine
    utilizations; run by the refresh worker after each new snapshot, never by a scrape. The
    PCIe counters of two reads give the traffic in bytes per second between them."""

    def __init__(self, session: NvmlSession, store: Store, clock: Clock) -> None:
        self.session = session
        self.store = store
        self.clock = clock
        self.reader = FieldReader(session)
        self._last: dict[int, tuple[float, DeviceFields]] = {}

    def tick(self) -> None:
        """One read of every GPU; raises NvmlError on a GPU fault (the last values stay)."""
        snap = self.store.snapshot
        if snap is None:
            return
        by_gpu: dict[int, DeviceFields] = {}
        rates: dict[int, tuple[float, float]] = {}
        with self.session.lock:
            for gpu in snap.inventory.gpus:
                handle = gpu_handle(self.session, gpu.index)
                now = self.clock()
                read = by_gpu[gpu.index] = self.reader.read(gpu.index, handle, gpu.mig_current)
                rate = _pcie_rate(self._last.get(gpu.index), now, read)
                if rate is not None:
                    rates[gpu.index] = rate
                self._last[gpu.index] = (now, read)
        self.store.publish_fields(FieldValues(by_gpu=by_gpu, pcie_rates=rates))


def _pcie_rate(
    before: tuple[float, DeviceFields] | None, now: float, read: DeviceFields
) -> tuple[float, float] | None:
    """(tx, rx) bytes per second since `before`; None without two reads of both counters, or
    when a counter went back (the driver reloaded)."""
    if before is None or now <= before[0]:
        return None
    old = before[1]
    pairs = ((old.pcie_tx_bytes, read.pcie_tx_bytes), (old.pcie_rx_bytes, read.pcie_rx_bytes))
    if any(a is None or b is None or b < a for a, b in pairs):
        return None
    seconds = now - before[0]
    (tx0, tx1), (rx0, rx1) = pairs
    assert tx0 is not None and tx1 is not None and rx0 is not None and rx1 is not None
    return (tx1 - tx0) / seconds, (rx1 - rx0) / seconds


class UtilizationSampler:
    """Per-process utilization of every GPU without MIG: one nvmlDeviceGetProcessUtilization
    per GPU, run by the refresh worker after each new snapshot (never by a scrape, never on a
    loop of its own). MIG-enabled GPUs are not asked: NVML has no per-process utilization
    there. With it, the MPS clients of every GPU and MIG device
    (nvmlDeviceGetMPSComputeRunningProcesses), which tell an MPS server's clients from the
    server. `clock` is the wall clock NVML dates its samples by (CPU time, microseconds);
    `mps_clients` False: the MPS clients are not read (only the DRA share metrics use them)."""

    def __init__(
        self, session: NvmlSession, store: Store, clock: Clock = time.time, mps_clients: bool = True
    ) -> None:
        self.session = session
        self.store = store
        self.clock = clock
        self.mps_clients = mps_clients
        self.reader = ProcessUtilizationReader(session)
        self._mig: dict[str, bool] = {}  # by GPU UUID, as last seen

    def tick(self) -> None:
        """One read of every GPU without MIG; raises NvmlError on a GPU fault (the last
        values stay)."""
        snap = self.store.snapshot
        if snap is None:
            return
        by_gpu: dict[int, dict[int, ProcessSample]] = {}
        mps: dict[int, MpsClients] = {}
        previous = self.store.utilization.by_gpu
        with self.session.lock:
            for gpu in snap.inventory.gpus:
                clients = (
                    self._mps_clients(gpu.index, gpu.slices if gpu.mig_current else None)
                    if self.mps_clients
                    else None
                )
                if clients is not None:
                    mps[gpu.index] = clients
                if self._mig.get(gpu.uuid, gpu.mig_current) != gpu.mig_current:
                    self.reader.forget(gpu.uuid)
                self._mig[gpu.uuid] = gpu.mig_current
                if gpu.mig_current:
                    continue
                samples = self.reader.read(gpu.index, gpu.uuid)
                if samples is None:
                    continue
                if not samples and self._too_soon(gpu.uuid):
                    # Asked again within one driver sample period: no news is not idleness.
                    old = previous.get(gpu.index, {})
                    samples = {pid: s for pid, s in old.items() if s.timestamp_us}
                idle = {p.pid: idle_sample(p.pid) for p in gpu.processes if p.pid not in samples}
                by_gpu[gpu.index] = {**idle, **samples}
        self.store.publish_utilization(ProcessUtilization(by_gpu, mps))

    def _mps_clients(self, index: int, slices: tuple[Slice, ...] | None) -> MpsClients | None:
        """The MPS clients of GPU `index` (`slices` None) or of its MIG devices; None when
        NVML lists none of them (not supported, or every read failed)."""
        if slices is None:
            return read_mps_clients(
                self.session, gpu_handle(self.session, index), context=f"GPU {index}"
            )
        found: MpsClients | None = None
        for s in slices:
            handle = None if s.mig_uuid is None else mig_handle(self.session, s.mig_uuid)
            if handle is None:  # no CI yet, or destroyed since the snapshot
                continue
            clients = read_mps_clients(self.session, handle, context=f"MIG device {s.mig_uuid}")
            if clients is not None:
                found = {**(found or {}), **clients}
        return found

    def _too_soon(self, uuid: str) -> bool:
        newest = self.reader.newest(uuid)
        return newest > 0 and self.clock() * 1e6 - newest < MAX_SAMPLE_PERIOD_US
