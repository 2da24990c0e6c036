"""Publish this node's ResourceSlices, and only when they change.

The pool (named after the node) is all or nothing for the scheduler: it uses only the slices
of the pool's highest generation, and only once it has `resourceSliceCount` of them. So a
change writes every slice with the next generation (creating and patching), and only then
deletes the slices no longer wanted. A publish that finds the API already as wanted (a
restart) writes nothing: it compares what the server keeps (the spec without the pool; a key
with an empty value is an absent one, as the server omits them: a slice of `devices: []` is
stored without `devices`, seen on v1.36.2, and compared as sent it was rewritten at every
restart).

Every write's answer is read back (GateWatch probes only every PROBE_INTERVAL_SECONDS): counters
slices go first and hold no device, so when the API server drops counters (its
DRAPartitionableDevices gate turned off since the last probe; kube-apiserver drops them from a
slice that had none, pkg/registry/resource/resourceslice/strategy.go,
dropDisabledDRAPartitionableDevicesFields) the publish stops there, before any device could go
out without them. The pool's newest generation then holds that one slice and no device, and
the scheduler takes only the newest generation's slices (kubernetes/kubernetes
staging/src/k8s.io/dynamic-resource-allocation/structured/pools.go, GatherPools), so nothing
is allocated from the pool until the next publish, of the safe devices, a reconcile later.

Nothing here deletes the slices when the agent stops or --dra is turned off: the kubelet does,
as for every DRA driver (kubernetes/kubernetes#125163, #129832, #132058; NVIDIA's driver
leaves them too). When the plugin's registration socket goes (a clean stop removes it) or its
connection drops (a killed agent), the kubelet deletes the node's slices of the driver unless
the plugin registers again within its grace period, so a restart or an upgrade leaves the
devices schedulable throughout; and a starting kubelet deletes all of its node's slices.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger
from nodeagent.dra.devices import SliceSpec
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.resource import API_VERSION

log = get_logger("nodeagent.dra")


def _normal(value: Any) -> Any:
    """`value` without the keys whose value is None or empty (the server omits them)."""
    if isinstance(value, dict):
        pairs = ((k, _normal(v)) for k, v in value.items())
        return {k: v for k, v in pairs if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _matters(spec: dict[str, Any]) -> Any:
    """What a spec is, compared: without the pool, without empty values."""
    return _normal({k: v for k, v in spec.items() if k != "pool"})


@dataclass(frozen=True)
class GatedField:
    """A device field the API server drops where its feature gate is off: what is said, once,
    when a write's answer lacks it."""

    key: str  # in each device of a slice
    event: str
    gate: str
    message: str


BINDING = GatedField(
    "bindingConditions",
    "dra.binding_conditions_dropped",
    "DRADeviceBindingConditions",
    "the API server drops the devices' binding conditions: slices not made yet are made when"
    " the kubelet prepares the claim, after the pod binds",
)
TAINTS = GatedField(
    "taints",
    "dra.taints_dropped",
    "DRADeviceTaints",
    "the API server drops the devices' taints: a faulty GPU or slice stays schedulable; its"
    " health still goes to the kubelet's health stream",
)


def _carries(spec: dict[str, Any], field: GatedField) -> bool:
    return any(d.get(field.key) for d in spec.get("devices") or [])


def _has_counters(spec: dict[str, Any]) -> bool:
    devices = spec.get("devices") or []
    return bool(spec.get("sharedCounters")) or any(d.get("consumesCounters") for d in devices)


class SlicePublisher:
    """Keeps the node's ResourceSlices of `driver` equal to the wanted ones."""

    def __init__(self, api: DraApi, driver: str) -> None:
        self.api = api
        self.driver = driver
        self.pool = api.name
        self._published: list[SliceSpec] | None = None
        self.generation = 0
        self.writes = 0  # create, patch and delete calls made (metrics, tests)
        # Whether the API server dropped the counters (DRAPartitionableDevices off); None
        # before the first read-back.
        self.counters_dropped: bool | None = None
        # Told when a write's answer lacks the counters it was sent with (GateWatch says it).
        self.on_counters_dropped: Callable[[], None] | None = None
        # Whether the API server dropped each gated device field (its gate off:
        # pkg/registry/resource/resourceslice/strategy.go drops them as it drops counters);
        # a field is absent before a write that sent it.
        self.dropped: dict[GatedField, bool] = {}

    def publish(self, wanted: Sequence[SliceSpec]) -> bool:
        """Make the API hold exactly `wanted`; True when something was written. Raises
        KubeError (the next publish tries again: nothing is remembered as published)."""
        wanted = list(wanted)
        if self._published == wanted:
            return False
        # Each read through its shape (DraApi.read_slice): one that cannot be read is skipped
        # and said once, as in every list the agent reads.
        existing = {s["metadata"]["name"]: s for s in self.api.list_slices(self.driver)}
        pools = {name: s["spec"].get("pool") or {} for name, s in existing.items()}
        top = max((int(p.get("generation") or 0) for p in pools.values()), default=0)
        same = set(existing) == {w.name for w in wanted} and all(
            _matters(existing[w.name]["spec"]) == _matters(w.spec)
            and pools[w.name].get("generation") == top
            and pools[w.name].get("resourceSliceCount") == len(wanted)
            for w in wanted
        )
        if same:
            self._published, self.generation = wanted, top
            return False
        self.generation = top + 1
        pool = {"name": self.pool, "generation": self.generation, "resourceSliceCount": len(wanted)}
        for w in wanted:
            body: dict[str, Any] = {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": w.name},
                "spec": {**copy.deepcopy(w.spec), "pool": pool},
            }
            if w.name in existing:
                # Keys the old spec had and the new one lacks (devices <-> sharedCounters).
                gone = dict.fromkeys(set(existing[w.name]["spec"]) - set(body["spec"]))
                patch = {"spec": {**gone, **body["spec"]}}
                stored: dict[str, Any] | None = self.api.patch_slice_stored(w.name, patch)
            else:
                stored = self.api.create_slice_stored(body)
            self.writes += 1
            sent = _has_counters(w.spec)
            if sent and stored is not None and not _has_counters(stored["spec"]):
                self._dropped(w.name)
                return True  # nothing remembered: the next publish writes again
            for field in (BINDING, TAINTS):
                if stored is not None and _carries(w.spec, field):
                    self._kept(field, _carries(stored["spec"], field), w.name)
        for name in sorted(set(existing) - {w.name for w in wanted}):
            self.api.delete_slice(name)
            self.writes += 1
        self._published = wanted
        log.info("dra.slices.published", generation=self.generation, slices=len(wanted))
        return True

    @property
    def binding_dropped(self) -> bool | None:
        return self.dropped.get(BINDING)

    @property
    def taints_dropped(self) -> bool | None:
        return self.dropped.get(TAINTS)

    def _kept(self, field: GatedField, kept: bool, name: str) -> None:
        """A write's answer said whether `field` was kept: said once when it is not (the next
        publish leaves it out, so the slices compare equal again)."""
        if not kept and self.dropped.get(field) is not True:
            log.warning(field.event, slice=name, gate=field.gate, message=field.message)
        self.dropped[field] = not kept

    def _dropped(self, name: str) -> None:
        log.info("dra.slices.counters_dropped_on_write", slice=name, generation=self.generation)
        if self.on_counters_dropped is not None:
            self.on_counters_dropped()
        else:
            self.counters_dropped = True


PROBE_INTERVAL_SECONDS = 600.0
GATE = "DRAPartitionableDevices"


class GateWatch:
    """Whether the API server keeps the slices' counters (its DRAPartitionableDevices feature
    gate), asked with a dry-run create (DraApi.counters_kept: nothing is stored) at the first
    publish and every PROBE_INTERVAL_SECONDS after. A change is said once: a log line, a Node
    Event, and `publisher.counters_dropped` (the metric nodeagent_dra_partitionable_devices).
    A probe the API server cannot answer keeps the last verdict (none yet: counters kept, as
    before the probe existed)."""

    def __init__(
        self,
        api: DraApi,
        driver: str,
        publisher: SlicePublisher,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.driver = driver
        self.publisher = publisher
        self.clock = clock
        self._next = 0.0
        publisher.on_counters_dropped = lambda: self._changed(True)

    def counters_dropped(self) -> bool:
        now = self.clock()
        if now >= self._next:
            self._next = now + PROBE_INTERVAL_SECONDS
            try:
                dropped = not self.api.counters_kept(self.driver)
            except AgentError as err:
                log.warning("dra.gate_probe_failed", error=str(err))
            else:
                self._changed(dropped)
        return bool(self.publisher.counters_dropped)

    def _changed(self, dropped: bool) -> None:
        before = self.publisher.counters_dropped
        self.publisher.counters_dropped = dropped
        if before == dropped or (before is None and not dropped):
            return
        if dropped:
            message = (
                f"the API server drops ResourceSlice counters (feature gate {GATE} is off):"
                " publishing only devices that cannot overlap (whole GPUs with MIG off, the MIG"
                " slices that exist); claims cannot make new slices until the gate is on"
            )
            log.warning("dra.counters_dropped", gate=GATE, message=message)
            reason, kind = "DRAPartitionableDevicesOff", "Warning"
        else:
            message = (
                f"the API server keeps ResourceSlice counters again ({GATE} is on): every MIG"
                " placement is published"
            )
            log.info("dra.counters_kept", gate=GATE, message=message)
            reason, kind = "DRAPartitionableDevicesOn", "Normal"
        try:
            self.api.event(reason, message, kind)
        except AgentError as err:  # the log line and the metric say it all the same
            log.warning("dra.event_failed", reason=reason, error=str(err))
