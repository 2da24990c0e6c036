"""The agent's own Node: watched, read for the wanted MIG config, written with labels and state.

Kubernetes does not reconcile anything here; it hands the wanted config to the pipeline and
writes what the pipeline reports:

- `NodeWatcher` lists and watches this Node only (nodeagent.kube.informer); every change of its
  labels or annotations wakes the reconcile worker. It keeps the latest Node in a `NodeView`,
  guarded by resourceVersion: the agent's own patches are in the view from their answers, so
  when they come back through the watch (older or the same) they wake nothing.
- `NodeLabelDesire` is the pipeline's desire source on Kubernetes: the label
  `nvidia.com/mig.config` (mig-manager's protocol; `kube.mig-config-label` names another key,
  so that nodeagent and mig-manager never act on the same label). A value that failed is not
  tried again while the label keeps it; every change of the label (also away and back to the
  same value) or a user removing the state label asks again.
- `KubeReporter` writes `<label>.state` = pending | success | failed (`pending` only when
  something is about to change, as mig-manager), `rebooting` when a MIG mode change waits for
  the node to reboot (held like a failure until the agent starts again: a config still waiting
  for its mode after that is `failed`, as mig-manager), the reason of a failure (annotation
  `nodeagent.io/mig.config.reason`) and Events.
- `NodeLabelSink` merge-patches the labels nodeagent owns (and only those) onto the Node.

With nothing changing, nothing is written.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.base.errors import KubeError
from nodeagent.base.logs import get_logger
from nodeagent.base.shapes import MapOf, Shape, check
from nodeagent.base.units import whole_number
from nodeagent.kube.api import NodeApi
from nodeagent.kube.informer import Informer, Source
from nodeagent.kube.nodelabels import ANNOTATION_PREFIX, label_patch
from nodeagent.labels.render import slice_usage
from nodeagent.reconcile import Report, Wanted
from nodeagent.settings import Settings
from nodeagent.state.snapshot import Snapshot

log = get_logger("nodeagent.kube")
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
REASON = ANNOTATION_PREFIX + "mig.config.reason"
SLICES_ANNOTATION = ANNOTATION_PREFIX + "mig.slices"
SHARING_CONFIG = "nodeagent.io/sharing.config"
SHARING_STATE = "nodeagent.io/sharing.config.state"
SHARING_REASON = ANNOTATION_PREFIX + "sharing.config.reason"


def _meta(node: Mapping[str, Any] | None, key: str) -> dict[str, str]:
    if not node:
        return {}
    value: dict[str, str] = node.get("metadata", {}).get(key) or {}
    return value


NODE: Shape = {
    "metadata": {
        "name": str, "resourceVersion": str, "labels": MapOf(str), "annotations": MapOf(str),
    }
}  # fmt: skip


def read_node(node: dict[str, Any]) -> dict[str, Any]:
    """`node`, once the fields the agent reads have their JSON types. Raises Unreadable."""
    check(node, NODE, f"node {_meta_name(node)}")
    return node


def _version(node: Mapping[str, Any] | None) -> object:
    meta = node.get("metadata") if node else None
    return meta.get("resourceVersion") if isinstance(meta, dict) else None


def _meta_name(node: dict[str, Any]) -> str:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else "(no name)"


_VERSION_DIGITS = 19  # an int64, etcd's revision


def _older(version: object, than: object) -> bool:
    """Whether the resourceVersion `version` is older than `than` or the same. Versions are
    opaque to clients, but every API server (etcd's revision) gives integers; any other pair
    counts as newer, as before the guard: one that is not ASCII digits ('²', a sign) or longer
    than an int64 (etcd's revision) is not comparable, never a ValueError in the worker."""
    if not isinstance(version, str) or not isinstance(than, str):
        return False
    if version == than:
        return True
    older, newer = whole_number(version, _VERSION_DIGITS), whole_number(than, _VERSION_DIGITS)
    return older is not None and newer is not None and older < newer


class NodeView:
    """The latest Node object seen: from the watch, or the answer to our own patch. A Node
    not newer than the one kept (by resourceVersion) is not taken: the watch's copy of our
    own patch, whose answer is kept already, changes nothing and wakes nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.node: dict[str, Any] | None = None
        self._changes: dict[str, int] = {}  # label key -> how often its value changed

    def update(self, node: dict[str, Any]) -> bool:
        """Keep `node` if it is newer; return whether its labels or annotations changed."""
        with self._lock:
            if self.node is not None and _older(_version(node), _version(self.node)):
                return False
            labels = _meta(node, "labels")
            before = (_meta(self.node, "labels"), _meta(self.node, "annotations"))
            if self.node is not None:
                for key in set(before[0].items()) ^ set(labels.items()):
                    self._changes[key[0]] = self._changes.get(key[0], 0) + 1
            self.node = node
            return before != (labels, _meta(node, "annotations"))

    def changes(self, key: str) -> int:
        """How often the label `key` changed value (set, changed, removed) since the first
        Node seen: A -> B -> A counts 2, so a value that comes back is a new request."""
        with self._lock:
            return self._changes.get(key, 0)

    def labels(self) -> dict[str, str]:
        return dict(_meta(self.node, "labels"))

    def annotations(self) -> dict[str, str]:
        return dict(_meta(self.node, "annotations"))


@dataclass(frozen=True)
class LabelProtocol:
    """mig-manager's protocol on one label: the wanted name, its state, the reason."""

    config: str
    state: str
    reason: str
    what: str
    event: str  # Event reason prefix


def mig_protocol(label: str = MIG_CONFIG) -> LabelProtocol:
    """mig-manager's protocol on `label` (its state on `<label>.state`)."""
    return LabelProtocol(label, label + ".state", REASON, "MIG config", "MigConfig")


MIG = mig_protocol()
SHARING = LabelProtocol(
    SHARING_CONFIG, SHARING_STATE, SHARING_REASON, "sharing config", "SharingConfig"
)


class NodeLabelDesire:
    """The wanted config is a node label: `nodeagent.io/sharing.config` (a per-GPU sharing
    config) or else `nvidia.com/mig.config` (mig-manager's). Remembers a value that failed
    (also across an agent restart: the state label says so) while the label keeps that value:
    any change of the label (to another value, or away and back) or a user removing the state
    label asks again."""

    def __init__(self, view: NodeView, mig_label: str = MIG_CONFIG) -> None:
        self.view = view
        self.mig = mig_protocol(mig_label)
        labels = view.labels()
        # protocol -> (the value that failed, the label's change count when it was asked for)
        self.failed: dict[LabelProtocol, tuple[str, int]] = {}
        self._asked: dict[LabelProtocol, tuple[str, int]] = {}
        for proto in (self.mig, SHARING):
            if labels.get(proto.state) == "failed" and labels.get(proto.config):
                self.failed[proto] = (labels[proto.config], view.changes(proto.config))

    def _held(self, proto: LabelProtocol, name: str | None) -> bool:
        return self.failed.get(proto) == (name, self.view.changes(proto.config))

    def hold(self, proto: LabelProtocol, name: str) -> None:
        """`name` failed: not tried again while the label keeps the value it had when the
        pipeline asked for it (a change since then is a new request)."""
        asked = self._asked.get(proto)
        changes = asked[1] if asked and asked[0] == name else self.view.changes(proto.config)
        self.failed[proto] = (name, changes)

    def failure(self) -> str | None:
        """Why the wanted config is not applied, while it stays failed (for /readyz)."""
        labels, notes = self.view.labels(), self.view.annotations()
        for proto, (name, _) in list(self.failed.items()):
            if labels.get(proto.config) == name and self._held(proto, name):
                reason = notes.get(proto.reason) or "see the node's events"
                how = "waits for a reboot" if labels.get(proto.state) == "rebooting" else "failed"
                return f"{proto.what} {name!r} {how}: {reason}"
        return None

    def protocol_of(self, wanted: Wanted) -> LabelProtocol:
        return SHARING if wanted.sharing_config is not None else self.mig

    def wanted(self, settings: Settings) -> Wanted:
        """The wanted config, and the device plugin config the node's label names."""
        plugin = self.view.labels().get(settings.labels.device_plugin_config_label) or None
        return dataclasses.replace(self._wanted(settings), device_plugin_config=plugin)

    def _wanted(self, settings: Settings) -> Wanted:
        labels = self.view.labels()
        proto = SHARING if labels.get(SHARING_CONFIG) else self.mig
        name, state = labels.get(proto.config), labels.get(proto.state)
        if not name:
            return Wanted("node-label", None)
        if state is not None and self._held(proto, name):
            return Wanted("node-label", None)  # waits for a change (or a cleared state)
        self.failed.pop(proto, None)  # a new request, or a cleared state: ask again
        self._asked[proto] = (name, self.view.changes(proto.config))
        rebooted = state == "rebooting"  # the node rebooted (or the agent started again)
        if proto is SHARING:
            return Wanted(
                "node-label", None, tracked=True, sharing_config=name, after_reboot=rebooted
            )
        return Wanted("node-label", name, tracked=True, after_reboot=rebooted)


class KubeReporter:
    """mig-manager's state label, plus the reason and Events it never gave."""

    def __init__(self, api: NodeApi, view: NodeView, desire: NodeLabelDesire) -> None:
        self.api = api
        self.view = view
        self.desire = desire

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        """Events are for people reading `kubectl describe node`: one that cannot be posted is
        logged, never a reason to fail or repeat a MIG change."""
        try:
            self.api.event(reason, message, kind)
        except KubeError as err:
            log.warning("event.failed", reason=reason, error=str(err))

    def _set_state(self, proto: LabelProtocol, state: str, reason: str | None) -> None:
        if self.view.labels().get(proto.state) == state and (
            self.view.annotations().get(proto.reason) == reason
        ):
            return
        node = self.api.patch_node(
            {"metadata": {"labels": {proto.state: state}, "annotations": {proto.reason: reason}}}
        )
        self.view.update(node)

    def changing(self, wanted: Wanted, operations: int) -> None:
        if not wanted.tracked:
            return
        proto = self.desire.protocol_of(wanted)
        name = wanted.sharing_config or wanted.mig_config
        log.info("config.requested", kind=proto.what, config=name, operations=operations)
        self._set_state(proto, "pending", None)
        self._event(f"{proto.event}Changing", f"applying {proto.what} {name!r}")

    def finished(self, report: Report) -> None:
        wanted = report.wanted
        if not wanted.tracked or report.step == "observe":
            return
        proto = self.desire.protocol_of(wanted)
        name = wanted.sharing_config or wanted.mig_config
        assert name is not None
        if report.reboot_required:
            self._rebooting(proto, name, report)
            return
        if report.result == "failure" and report.config_failed:
            self._set_state(proto, "failed", (report.reason or "")[:4096])
            # Only once the state says so: a lost write is reported again by the next run.
            self.desire.hold(proto, name)
            self._event(
                f"{proto.event}Failed", f"{proto.what} {name!r} failed: {report.reason}", "Warning"
            )
            log.error("config.failed", kind=proto.what, config=name, error=report.reason)
            return
        self._set_state(proto, "success", None)
        if report.operations or report.mps_change != "none":
            self._event(
                f"{proto.event}Applied",
                f"{proto.what} {name!r} applied ({report.operations} NVML operations)",
            )
            log.info("config.applied", kind=proto.what, config=name, operations=report.operations)

    def _rebooting(self, proto: LabelProtocol, name: str, report: Report) -> None:
        """mig-manager's `rebooting`: the mode change waits for a reboot (the agent's, with
        mig.with-reboot, once this state is written; else the admin's)."""
        self._set_state(proto, "rebooting", (report.reason or "")[:4096])
        self.desire.hold(proto, name)  # not tried again before the agent starts again
        self._event(
            f"{proto.event}Rebooting",
            f"{proto.what} {name!r} waits for the node to reboot: {report.reason}",
            "Warning",
        )
        log.warning("config.rebooting", kind=proto.what, config=name, reason=report.reason)


class NodeLabelSink:
    """The smallest merge patch that makes the Node carry exactly nodeagent's labels."""

    name = "node"

    def __init__(self, api: NodeApi, view: NodeView) -> None:
        self.api = api
        self.view = view

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        node = self.view.node if self.view.node is not None else self.api.get_node()
        # Free and used slices change with every pod: one annotation, not labels.
        annotations: dict[str, str | None] = {
            SLICES_ANNOTATION: slice_usage(snapshot.inventory, dict(snapshot.allocated))
        }
        patch = label_patch(node, dict(labels), annotations)
        if patch is not None:
            self.view.update(self.api.patch_node(patch))
            log.info("labels.published", changes=sorted(patch["metadata"].get("labels", {})))


class NodeWatcher:
    """This Node, listed and watched (nodeagent.kube.informer); the kube-watch worker runs one
    pass per call. A change of its labels or annotations wakes the reconcile worker."""

    def __init__(
        self, api: NodeApi, view: NodeView, on_change: Callable[[], None], stop: threading.Event
    ) -> None:
        self.api = api
        self.view = view
        self.on_change = on_change
        self.stop_event = stop
        # Every patch of the Node through `api` (the state label, the labels, the paused
        # clients' labels) is in the view from its answer: it wakes nothing when it comes back.
        api.on_node_patched = view.update
        self.informer = Informer(
            Source("nodes", api.list_node, api.watch_node),
            read_node,
            self,
            stop,
            reconnect=api.reconnect,
        )

    @property
    def relists(self) -> int:
        """Watches that expired (410 Gone), each listed again."""
        return self.informer.expired

    def listed(self, objects: Sequence[dict[str, Any]]) -> None:
        for node in objects:
            self.handle(node)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.handle(obj)

    def handle(self, node: dict[str, Any]) -> None:
        # After any patch in flight: its answer is in the view before this is compared.
        with self.api.patching:
            changed = self.view.update(node)
        if changed:
            self.on_change()

    def cycle(self) -> None:
        """One pass: the node listed if there is no version to watch from, then watched until
        the watch ends. Raises KubeError (the worker backs off)."""
        self.informer.run()


def ensure_node(api: NodeApi) -> dict[str, Any]:
    """Fail early with a clear message when the node cannot be read (RBAC, wrong NODE_NAME)."""
    try:
        return api.get_node()
    except KubeError as err:
        raise KubeError(f"cannot read this agent's Node {api.name!r} (NODE_NAME): {err}") from err
