"""NFD's NodeFeature API as a label sink: the labels as a `NodeFeature` object, which
node-feature-discovery's master turns into node labels (GFD's default output since v0.19).

As GFD writes it (NVIDIA/k8s-device-plugin `internal/lm/output.go`, 1b826acc): the object
`nvidia-features-for-<node>` in the agent's namespace, labelled
`nfd.node.kubernetes.io/node-name=<node>` (how NFD finds the node it is for), `spec.labels` the
labels and `spec.features` empty; owned by the agent's DaemonSet (the controller) and its pod,
so that it is garbage-collected with them but survives a pod being replaced. Created when
missing, merge-patched when the labels or owners changed, never written otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.base.errors import KubeError
from nodeagent.base.logs import get_logger
from nodeagent.kube.api import CustomRef, NodeApi
from nodeagent.state.snapshot import Snapshot

log = get_logger("nodeagent.kube")
GROUP = "nfd.k8s-sigs.io"
VERSION = "v1alpha1"
PLURAL = "nodefeatures"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
NAME_PREFIX = "nvidia-features-for-"


@dataclass(frozen=True)
class PodRef:
    """The agent's pod, from the downward API (POD_NAME, POD_UID)."""

    name: str
    uid: str | None = None


def object_name(node: str) -> str:
    return NAME_PREFIX + node


def owner_references(
    api: NodeApi, namespace: str, pod: PodRef | None
) -> tuple[list[dict[str, Any]], bool]:
    """The DaemonSet that controls the agent's pod (read from the pod) and the pod itself, and
    whether that is final. Nothing when the pod is unknown; the pod alone (from its downward-API
    UID) while it cannot be read (logged, asked again next time)."""
    if pod is None:
        return [], True
    uid, daemonset, final = pod.uid, None, True
    try:
        found = api.read_pod(namespace, pod.name)
    except KubeError as err:
        found, final = None, False
        log.warning("nodefeature.owner_unknown", pod=f"{namespace}/{pod.name}", error=str(err))
    if found is not None:
        meta = found.get("metadata", {})
        uid = uid or meta.get("uid")
        daemonset = next(
            (o for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"), None
        )
    refs = []
    if daemonset is not None:
        refs.append(
            {
                "apiVersion": daemonset.get("apiVersion", "apps/v1"),
                "kind": "DaemonSet",
                "name": daemonset.get("name"),
                "uid": daemonset.get("uid"),
                "controller": True,
            }
        )
    if uid:
        refs.append({"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": uid})
    return refs, final


def _owners(refs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r.get("kind", ""), r.get("name", ""), r.get("uid", "")) for r in refs]


class NodeFeatureSink:
    """Publishes the labels as this node's NodeFeature object."""

    name = "nodefeature"

    def __init__(self, api: NodeApi, namespace: str, pod: PodRef | None) -> None:
        self.api = api
        self.node = api.name
        self.ref = CustomRef(GROUP, VERSION, PLURAL, namespace)
        self.pod = pod
        self._owners: list[dict[str, Any]] | None = None  # once known for sure

    def owners(self) -> list[dict[str, Any]]:
        if self._owners is not None:
            return self._owners
        refs, final = owner_references(self.api, self.ref.namespace, self.pod)
        if final:
            self._owners = refs
        return refs

    def body(self, labels: Mapping[str, str]) -> dict[str, Any]:
        """The whole object, as created."""
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NodeFeature",
            "metadata": {
                "name": object_name(self.node),
                "namespace": self.ref.namespace,
                "labels": {NODE_NAME_LABEL: self.node},
                "ownerReferences": self.owners(),
            },
            "spec": {
                "features": {"flags": {}, "attributes": {}, "instances": {}},
                "labels": dict(labels),
            },
        }

    def patch(self, current: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
        """The merge patch that brings `current` to `labels` and our owners ({} if none)."""
        meta, spec = current.get("metadata") or {}, current.get("spec") or {}
        body: dict[str, Any] = {}
        have = spec.get("labels") or {}
        changed: dict[str, str | None] = {k: v for k, v in labels.items() if have.get(k) != v}
        changed.update({k: None for k in have if k not in labels})
        if changed:
            body["spec"] = {"labels": changed}
        if (meta.get("labels") or {}).get(NODE_NAME_LABEL) != self.node:
            body.setdefault("metadata", {})["labels"] = {NODE_NAME_LABEL: self.node}
        owners = self.owners()
        if owners and _owners(meta.get("ownerReferences") or []) != _owners(owners):
            body.setdefault("metadata", {})["ownerReferences"] = owners
        return body

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        """Create the object, or patch what differs; no write when nothing does. Raises
        KubeError (a missing CRD reads as HTTP 404 on create: the message says what to do)."""
        name = object_name(self.node)
        current = self.api.get_custom(self.ref, name)
        if current is None:
            try:
                self.api.create_custom(self.ref, self.body(labels))
            except KubeError as err:
                if "HTTP 404" in str(err):
                    raise KubeError(
                        f"{err} (is node-feature-discovery's NodeFeature CRD installed? turn"
                        " kube.node-feature-api off if not)"
                    ) from err
                raise
            log.info("nodefeature.created", name=f"{self.ref.namespace}/{name}")
            return
        patch = self.patch(current, labels)
        if patch:
            self.api.patch_custom(self.ref, name, patch)
            log.info(
                "nodefeature.updated",
                name=f"{self.ref.namespace}/{name}",
                changes=sorted((patch.get("spec") or {}).get("labels") or {}),
            )
