"""Slices made before the pod binds (KEP-5007, DRADeviceBindingConditions): the watcher of the
claims allocated to this node.

A MIG placement not made yet is published with binding conditions (nodeagent.dra.devices);
the scheduler copies them into the claim's allocation result, writes the allocation and then
waits in PreBind (it reads the claim every 5 s, for at most its bindingTimeout, 600 s by
default) until every binding condition of the device's status.devices entry is True, or fails
the binding at once when a failure condition is True: it unreserves the claim and the pod goes
back to its queue (kube-scheduler v1.36.2, plugins/dynamicresources: PreBind,
isClaimReadyForBinding).

The claims are listed once, then watched from that list's resourceVersion (`run`, the
dra-bind worker: a watch is one request a minute at steady state, where listing every claim
of the cluster each second was 60 a minute and grew with the cluster); listed again only when
the watch expires (410). Each claim allocated to this node's pool whose waited-on devices are
not settled gets its slices made through the one engine (NodeDriver.make: the ownership record, the
planner, the MIG writer lock), then the binding conditions True in their status.devices
(nodeagent.dra.k8s.reports); a make that fails writes the failure condition with its error. The
kubelet's prepare then finds the slices made and adopts them. A claim made here and no longer
allocated here (deleted, deallocated after a failed binding) before the kubelet prepared it
is undone: nothing it made stays held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger
from nodeagent.dra.checkpoint import PreparedClaim
from nodeagent.dra.claims import ClaimRef, checked_claim
from nodeagent.dra.k8s.allocated import allocated_to, claims_source
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.reports import StatusReports
from nodeagent.dra.node import NodeDriver
from nodeagent.dra.status import binding_results, binding_settled, device_data
from nodeagent.kube.informer import Informer

log = get_logger("nodeagent.dra")
INTERVAL_SECONDS = 1.0  # between two watches of the claims (each ends after the watch timeout)
MAKE_SECONDS = 30.0  # a make's wait for the MIG writer lock


class Binder:
    """Makes the slices of the claims the scheduler waits on, and says so in their status."""

    def __init__(
        self,
        api: DraApi,
        node: NodeDriver,
        reports: StatusReports,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.node = node
        self.reports = reports
        self.driver = node.config.driver
        self.pool = node.config.pool
        self.clock = clock
        self.informer = Informer(
            claims_source(api), checked_claim, self, api.stop_event, reconnect=api.reconnect
        )
        self._waiting: dict[str, PreparedClaim] = {}  # the checkpoint's, read before a list
        # The claims this binder said ready while they stay allocated here: a watch event of
        # before that write (it can come after the kubelet's prepare and unprepare, under
        # load) shows the binding still unsettled, and must not make the slices again.
        self._settled: set[str] = set()

    @property
    def version(self) -> str | None:
        """The resourceVersion watched from (None: the next pass lists)."""
        return self.informer.version

    def run(self) -> None:
        """The worker's pass: a list when there is none to watch from (the first pass, or the
        watch expired), then a watch of the claims until the API server ends it. Raises
        KubeError (the worker backs off), ConfigError (an unreadable checkpoint)."""
        self.informer.run(relist=self.cycle)

    def cycle(self) -> None:
        """One list: every claim allocated here bound, every claim made here but no longer
        allocated here released. Raises KubeError when the claims cannot be listed, ConfigError
        when the checkpoint cannot be read."""
        # The checkpoint before the list: a claim it holds that the list lacks was not
        # allocated here when the list was taken, so a prepare starting now is not undone.
        self._waiting = self.node.waiting()
        self.informer.relist()

    def listed(self, objects: Sequence[dict[str, Any]]) -> None:
        claims = [c for c in objects if allocated_to(c, self.driver, self.pool)]
        allocated = {str((c.get("metadata") or {}).get("uid")) for c in claims}
        for claim in claims:
            if binding_results(claim, self.driver, self.pool):
                self._bind(claim)
        self._settled &= allocated
        for uid, record in self._waiting.items():
            if uid not in allocated:
                self._release(uid, f"{record.namespace}/{record.name}")

    def changed(self, kind: str, claim: dict[str, Any]) -> None:
        """One watched change: a claim allocated here bound; one made here that is gone or no
        longer allocated here released."""
        here = kind != "DELETED" and allocated_to(claim, self.driver, self.pool)
        if here and binding_results(claim, self.driver, self.pool):
            self._bind(claim)
        elif not here:
            uid = str((claim.get("metadata") or {}).get("uid"))
            self._settled.discard(uid)  # allocated here again later: a binding of its own
            record = self.node.waiting().get(uid)
            if record is not None:
                self._release(uid, f"{record.namespace}/{record.name}")

    def _bind(self, claim: dict[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        if meta.get("deletionTimestamp") or binding_settled(claim, self.driver, self.pool):
            return
        if str(meta.get("uid")) in self._settled:  # an event of before our own status write
            return
        ref = ClaimRef(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
        deadline = self.clock() + MAKE_SECONDS
        try:
            made = self.node.make(ref, claim, deadline)
        except AgentError as err:
            log.warning("dra.binding_failed", claim=str(ref), error=str(err))
            self.reports.binding(ref, claim, None, str(err), self.clock() + MAKE_SECONDS)
            return
        data = {d.device: device_data(d) for d in made}
        if self.reports.binding(ref, claim, data, "", self.clock() + MAKE_SECONDS):
            self._settled.add(ref.uid)
            log.info("dra.binding_ready", claim=str(ref), devices=sorted(data))

    def _release(self, uid: str, name: str) -> None:
        try:
            self.node.unprepare(uid, self.clock() + MAKE_SECONDS)
        except AgentError as err:  # the next cycle tries again
            log.warning("dra.binding_release_failed", claim=name, uid=uid, error=str(err))
            return
        log.info("dra.binding_released", claim=name, uid=uid)
