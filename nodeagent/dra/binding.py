"""Slices made before the pod binds (KEP-5007, DRADeviceBindingConditions): the watcher of the
claims allocated to this node.

A MIG placement not made yet is published with binding conditions (nodeagent.dra.devices);
the scheduler copies them into the claim's allocation result, writes the allocation and then
waits in PreBind (it reads the claim every 5 s, for at most its bindingTimeout, 600 s by
default) until every binding condition of the device's status.devices entry is True, or fails
the binding at once when a failure condition is True: it unreserves the claim and the pod goes
back to its queue (kube-scheduler v1.36.2, plugins/dynamicresources: PreBind,
isClaimReadyForBinding).

Each cycle: the claims allocated to this node's pool whose waited-on devices are not settled
get their slices made through the one engine (NodeDriver.make: the ownership record, the
planner, the MIG writer lock), then the binding conditions True in their status.devices
(nodeagent.dra.reports); a make that fails writes the failure condition with its error. The
kubelet's prepare then finds the slices made and adopts them. A claim made here and no longer
allocated here (deleted, deallocated after a failed binding) before the kubelet prepared it
is undone: nothing it made stays held.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger
from nodeagent.dra.allocated import allocated_claims
from nodeagent.dra.api import DraApi
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.dra.reports import StatusReports
from nodeagent.dra.status import binding_results, binding_settled, device_data

log = get_logger("nodeagent.dra")
INTERVAL_SECONDS = 1.0  # between two lists of the claims (the scheduler reads every 5 s)
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

    def cycle(self) -> None:
        """One pass. Raises KubeError when the claims cannot be listed (the worker backs off),
        ConfigError when the checkpoint cannot be read."""
        # The checkpoint before the list: a claim it holds that the list lacks was not
        # allocated here when the list was taken, so a prepare starting now is not undone.
        waiting = self.node.waiting()
        claims = allocated_claims(self.api, self.driver)
        allocated = {str((c.get("metadata") or {}).get("uid")) for c in claims}
        for claim in claims:
            if binding_results(claim, self.driver, self.pool):
                self._bind(claim)
        for uid, record in waiting.items():
            if uid not in allocated:
                self._release(uid, f"{record.namespace}/{record.name}")

    def _bind(self, claim: dict[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        if meta.get("deletionTimestamp") or binding_settled(claim, self.driver, self.pool):
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
            log.info("dra.binding_ready", claim=str(ref), devices=sorted(data))

    def _release(self, uid: str, name: str) -> None:
        try:
            self.node.unprepare(uid, self.clock() + MAKE_SECONDS)
        except AgentError as err:  # the next cycle tries again
            log.warning("dra.binding_release_failed", claim=name, uid=uid, error=str(err))
            return
        log.info("dra.binding_released", claim=name, uid=uid)
