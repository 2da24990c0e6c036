"""The one owner of what the agent knows about its GPUs: an immutable Snapshot.

Every reader (collectors, labels, the pipeline) takes `store.snapshot` once and works on that
object, so it never mixes two reads. A snapshot is replaced in one assignment, and only by a
newer read: each read takes its generation number under the NVML lock before it starts, so a
read that began before a MIG change can never publish the old geometry after it.

The store is also the collectors' one read model: beside the snapshot and the samplers' values,
each owner publishes what the scrape shows of it (the offers of the last published sharing,
the managed MPS daemon's status, the workers' error counts, the failed NVML calls); a scrape
reads these values and never the pipeline, the MPS manager, the workers or the NVML session.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger, printable
from nodeagent.mps.daemon import MpsStatus
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.nvml.fields import DeviceFields
from nodeagent.nvml.health import THROTTLE_REASONS, Health
from nodeagent.nvml.utilization import ProcessSample, read_rates

# The NVML value types the collectors read, named here: metrics/ reads the store, never nvml/.
__all__ = [
    "THROTTLE_REASONS",
    "Allocations",
    "DeviceFields",
    "FieldValues",
    "GpmValues",
    "GpuOffers",
    "Health",
    "HealthValues",
    "Holder",
    "Holders",
    "Inventory",
    "MpsStatus",
    "ProcessSample",
    "ProcessUtilization",
    "Snapshot",
    "Store",
    "Telemetry",
    "device_uuid",
    "in_use_view",
]

log = get_logger("nodeagent.state.snapshot")
Clock = Callable[[], float]


@dataclass(frozen=True, order=True)
class Holder:
    """The container a device was allocated to (kubelet pod-resources), or the DRA claim
    holding it (`kind` "claim", `pod` the claim's name, no container)."""

    namespace: str
    pod: str
    container: str
    kind: str = "pod"

    def __str__(self) -> str:
        # Names from a record or the kubelet, shown escaped: a newline in one cannot start a
        # line of its own in a message.
        namespace, pod = printable(self.namespace), printable(self.pod)
        if not (namespace or pod):
            return self.kind  # no object to name: the kind says it all
        if not namespace:
            return f"{self.kind} {pod}"
        return f"{self.kind} {namespace}/{pod}"


# Device id (GPU UUID, MIG UUID, or `<uuid>::<n>` for a replica of a shared device) -> holder.
Holders = Mapping[str, Holder]
Allocations = Callable[[], Holders]


def device_uuid(device_id: str) -> str:
    """'MIG-abc::3' -> 'MIG-abc' (a replica of a shared device is its device)."""
    return device_id.split("::", 1)[0]


def in_use_view(holders: Holders) -> dict[str, str]:
    """{device UUID: 'pod NAMESPACE/NAME'}: what the MIG planner counts as in use. Replicas fold
    into their device; the first holder (in the kubelet's order) names it."""
    held: dict[str, str] = {}
    for device_id, holder in holders.items():
        held.setdefault(device_uuid(device_id), str(holder))
    return held


# GPU index -> (strategy, replicas): what each GPU offers, as last published (mig, mps,
# time-slicing or whole; nodeagent.sharing.offers).
GpuOffers = Mapping[int, tuple[str, int]]


@dataclass(frozen=True)
class Telemetry:
    """Per-GPU values read with the inventory that are not part of it."""

    utilization: Mapping[int, float | None] = field(default_factory=dict)
    memory_utilization: Mapping[int, float | None] = field(default_factory=dict)  # the same read


@dataclass(frozen=True)
class GpmValues:
    """GPM ratios (0-1) by metric name, per GPU and per (GPU, GPU instance id)."""

    by_gpu: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    by_gi: Mapping[tuple[int, int], Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessUtilization:
    """Per GPU without MIG, per pid: the process's newest utilization sample since the last
    refresh (all 0 for a running process NVML sent none for: it was idle). `mps_clients`: per
    GPU, the MPS clients on it or on its MIG devices, by pid, with the device memory each
    uses (None: NVML does not say); a GPU whose MPS clients NVML does not list is absent."""

    by_gpu: Mapping[int, Mapping[int, ProcessSample]] = field(default_factory=dict)
    mps_clients: Mapping[int, Mapping[int, int | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthValues:
    """The latest health reads: per GPU, per MIG device (gpu, gi_id, ci_id), and the XIDs seen
    since the agent started on each GPU it watches (a GPU that cannot report XIDs is absent)."""

    by_gpu: Mapping[int, Health] = field(default_factory=dict)
    by_slice: Mapping[tuple[int, int, int], Health] = field(default_factory=dict)
    xid_counts: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    last_xid: Mapping[int, int] = field(default_factory=dict)  # 0: none yet


@dataclass(frozen=True)
class FieldValues:
    """The latest field-value reads per GPU, and the PCIe traffic between the last two reads
    of each GPU in bytes per second (tx, rx)."""

    by_gpu: Mapping[int, DeviceFields] = field(default_factory=dict)
    pcie_rates: Mapping[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """One read of the node: GPUs, their telemetry, which devices pods hold (kubelet)."""

    inventory: Inventory
    telemetry: Telemetry
    allocated: Mapping[str, str]  # device UUID -> the pod holding it (in_use_view of holders)
    taken_at: float  # wall clock, when the read began
    generation: int
    holders: Holders = field(default_factory=dict)  # device id -> the container holding it
    # Why the kubelet could not be asked in this read (allocated/holders are the last answer).
    allocations_error: str | None = None


class Store:
    """Holds the latest Snapshot, GPM, health and field values: `observe()` is the only way to
    make a snapshot; the samplers hand theirs over with `publish_gpm` / `publish_health` /
    `publish_fields`, the other owners theirs with `publish_offers` (the pipeline's offers),
    `publish_mps` (the MPS manager's status), `publish_worker_errors` (each worker) and
    `publish_nvml_errors` (the NVML session). Each is replaced in one assignment: a reader
    takes the attribute once."""

    def __init__(self, session: NvmlSession, clock: Clock) -> None:
        self.session = session
        self.clock = clock
        self.snapshot: Snapshot | None = None
        self.gpm = GpmValues()
        self.health = HealthValues()
        self.fields = FieldValues()
        self.utilization = ProcessUtilization()
        self.offers: GpuOffers = {}
        self.mps: MpsStatus | None = None  # None: MPS not managed by this agent
        self.worker_errors: Mapping[str, int] = {}  # worker name -> failures since start
        self.nvml_errors: Mapping[str, int] = {}  # NVML function -> failed calls
        self.dropped = 0  # reads that finished after a newer one and were not published
        self._generations = itertools.count(1)
        self._publish_lock = threading.Lock()

    def observe(self, allocations: Allocations | None = None) -> Snapshot:
        """Read every GPU (under the session's NVML lock), ask `allocations` which devices pods
        hold, and publish the result unless a newer read was published meanwhile. Returns the
        snapshot now published. Raises NvmlError; a failing `allocations` keeps the last answer
        and says why in `allocations_error` (a MIG change then refuses to guess)."""
        with self.session.lock:
            generation = next(self._generations)
            taken_at = self.clock()
            inventory = read_inventory(self.session)
            rates = {
                g.index: None if g.mig_current else read_rates(self.session, g.index)
                for g in inventory.gpus
            }
        previous = self.snapshot
        holders: Holders = previous.holders if previous else {}
        error: str | None = None
        if allocations is not None:
            try:
                holders = allocations()
            except AgentError as err:  # metrics keep the last answer; a MIG change refuses
                error = str(err)
                log.warning("podresources.failed", error=error)
        snap = Snapshot(
            inventory,
            Telemetry(
                {i: None if r is None else r.gpu for i, r in rates.items()},
                {i: None if r is None else r.memory for i, r in rates.items()},
            ),
            in_use_view(holders),
            taken_at,
            generation,
            holders,
            error,
        )
        return self.offer(snap)

    def publish_gpm(self, values: GpmValues) -> None:
        """The GPM sampler's latest ratios."""
        self.gpm = values

    def publish_health(self, values: HealthValues) -> None:
        """The health sampler's latest reads."""
        self.health = values

    def publish_fields(self, values: FieldValues) -> None:
        """The field sampler's latest reads."""
        self.fields = values

    def publish_utilization(self, values: ProcessUtilization) -> None:
        """The utilization sampler's latest per-process samples."""
        self.utilization = values

    def publish_offers(self, offers: GpuOffers) -> None:
        """What each GPU offers, as the pipeline last published it."""
        self.offers = dict(offers)

    def publish_mps(self, status: MpsStatus | None) -> None:
        """The managed MPS daemon's status as last read (None: no daemon managed)."""
        self.mps = status

    def publish_worker_errors(self, worker: str, errors: int) -> None:
        """`worker`'s failures since it was made (0 when it is made)."""
        with self._publish_lock:
            self.worker_errors = {**self.worker_errors, worker: errors}

    def publish_nvml_errors(self, counts: Mapping[str, int]) -> None:
        """The failed NVML calls by function, as the session counts them."""
        self.nvml_errors = dict(counts)

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
