"""The own-node watch and mig-manager's reconfiguration protocol.

The desired MIG config name is the node label `nvidia.com/mig.config`; the state is
`nvidia.com/mig.config.state` = pending | success | failed, and the reason of a failure is the
annotation `nodeagent.io/mig.config.reason` (and a Warning Event on the Node). Steps: set
pending, validate and plan, pause GPU clients, apply, restore clients (always), publish labels,
set success or failed. With nothing changing, nothing is written.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import structlog

from nodeagent.errors import AgentError, KubeError
from nodeagent.kube.api import NodeApi, WatchExpired
from nodeagent.kube.clients import GpuClients
from nodeagent.kube.nodelabels import ANNOTATION_PREFIX, label_patch

log = structlog.get_logger("nodeagent.kube")
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
REASON = ANNOTATION_PREFIX + "mig.config.reason"


class MigHost(Protocol):
    """What the controller needs from the agent."""

    def refresh(self) -> None: ...
    def mig_matches(self, name: str) -> bool: ...
    def plan_mig(self, name: str) -> int: ...
    def apply_mig(self, name: str) -> int: ...
    def node_labels(self) -> dict[str, str]: ...
    def node_annotations(self) -> dict[str, str | None]: ...


def _labels(node: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = node.get("metadata", {}).get("labels") or {}
    return labels


class NodeController:
    def __init__(
        self, api: NodeApi, host: MigHost, clients: GpuClients, stop: threading.Event
    ) -> None:
        self.api = api
        self.host = host
        self.clients = clients
        self.stop_event = stop
        self.applied: str | None = None
        self.failed: str | None = None
        self.relists = 0

    # -- one node state -------------------------------------------------------------------

    def handle(self, node: dict[str, Any]) -> None:
        """React to the node as it is now: reconfigure if asked, then publish labels."""
        labels = _labels(node)
        wanted, state = labels.get(MIG_CONFIG), labels.get(MIG_STATE)
        if wanted and self._needs(wanted, state):
            self.reconfigure(wanted)
            node = self.api.get_node()
        self.publish(node)

    def _needs(self, wanted: str, state: str | None) -> bool:
        if state is None:  # no state yet, or a user cleared it to ask again
            self.failed = None
        if wanted == self.failed:
            return False  # failed already; waits for a new value (or a cleared state)
        if wanted == self.applied:
            # Done. Watch events may still show our own earlier writes (pending): only a
            # cleared state (a user asking again) re-runs it.
            return state is None
        if state == "success" and self.host.mig_matches(wanted):
            self.applied = wanted  # e.g. the agent restarted: nothing to do, nothing to write
            return False
        return True

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        """Events are for people reading `kubectl describe node`: one that cannot be posted is
        logged, never a reason to fail or repeat a MIG change."""
        try:
            self.api.event(reason, message, kind)
        except KubeError as err:
            log.warning("event.failed", reason=reason, error=str(err))

    def _set_state(self, state: str, reason: str | None) -> None:
        self.api.patch_node(
            {"metadata": {"labels": {MIG_STATE: state}, "annotations": {REASON: reason}}}
        )

    def reconfigure(self, wanted: str) -> None:
        log.info("mig.config.requested", config=wanted)
        self._set_state("pending", None)
        self._event("MigConfigChanging", f"applying MIG config {wanted!r}")
        error: AgentError | None = None
        try:
            operations = self.host.plan_mig(wanted)  # validates; nothing changes on failure
        except AgentError as err:
            operations, error = 0, err
        if operations and error is None:
            try:
                self.clients.pause()
                self.host.apply_mig(wanted)
            except AgentError as err:
                error = err
            finally:  # never leave the node paused, whatever failed
                try:
                    self.clients.restore()
                except AgentError as err:
                    error = error or err
        try:
            self.host.refresh()
        except AgentError as err:
            error = error or err
        if error is not None:
            self.failed = wanted
            self._set_state("failed", str(error)[:4096])
            self._event("MigConfigFailed", f"MIG config {wanted!r} failed: {error}", "Warning")
            log.error("mig.config.failed", config=wanted, error=str(error))
        else:
            self._set_state("success", None)
            self.applied, self.failed = wanted, None
            self._event(
                "MigConfigApplied", f"MIG config {wanted!r} applied ({operations} NVML operations)"
            )
            log.info("mig.config.applied", config=wanted, operations=operations)

    def publish(self, node: dict[str, Any] | None = None) -> None:
        node = node if node is not None else self.api.get_node()
        patch = label_patch(node, self.host.node_labels(), self.host.node_annotations())
        if patch is not None:
            self.api.patch_node(patch)
            log.info("labels.published", changes=sorted(patch["metadata"].get("labels", {})))

    # -- the watch ------------------------------------------------------------------------

    def run(self) -> None:
        """List the node, handle it, watch it; relist on expiry (410) or when the watch ends;
        back off on API errors. Until stopped."""
        backoff = 1.0
        while not self.stop_event.is_set():
            try:
                node = self.api.get_node()
                self.handle(node)
                version = node.get("metadata", {}).get("resourceVersion")
                for kind, obj in self.api.watch_node(version):
                    if self.stop_event.is_set():
                        return
                    if kind == "BOOKMARK":
                        continue
                    if kind != "DELETED":
                        self.handle(obj)
                backoff = 1.0
            except WatchExpired:
                self.relists += 1
                log.info("watch.expired", relists=self.relists)
            except AgentError as err:
                log.warning("watch.failed", error=str(err), retry_in=backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 30.0)


def ensure_node(api: NodeApi) -> None:
    """Fail early with a clear message when the node cannot be read (RBAC, wrong NODE_NAME)."""
    try:
        api.get_node()
    except KubeError as err:
        raise KubeError(f"cannot read this agent's Node {api.name!r} (NODE_NAME): {err}") from err
