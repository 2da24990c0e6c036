"""The resource.k8s.io/v1 objects the DRA driver reads and writes: this node's ResourceSlices
and the ResourceClaims the kubelet asks it to prepare. Same client, timeouts and retries as
the Node (NodeApi); plain JSON in and out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeagent.base.errors import KubeError
from nodeagent.base.shapes import Shape, Unreadable, check
from nodeagent.dra.resource import API_PATH, API_VERSION
from nodeagent.kube.api import MERGE_PATCH, NodeApi, _none_on, _path
from nodeagent.kube.objects import read_list

SLICES = f"{API_PATH}/resourceslices"
CLAIM = API_PATH + "/namespaces/{ns}/resourceclaims/{name}"
# The fields of a ResourceSlice the publisher reads (nodeagent.dra.k8s.slices).
SLICE: Shape = {
    "metadata": {"name": str},
    "spec": {
        "driver": str, "nodeName": str,
        "pool": {"name": str, "generation": int, "resourceSliceCount": int},
        "devices": [{"bindingConditions": list, "taints": list, "consumesCounters": list}],
        "sharedCounters": [dict],
    },
}  # fmt: skip


def read_slice(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj`, once it has a name, a spec, and the fields the publisher reads have their JSON
    types. Raises Unreadable."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    what = f"resourceslice {name}" if isinstance(name, str) and name else "a ResourceSlice"
    check(obj, SLICE, what)
    if what == "a ResourceSlice":
        raise Unreadable(f"{what} has no metadata.name", "metadata.name")
    if obj.get("spec") is None:
        raise Unreadable(f"{what} has no spec", "spec")
    return obj


class DraApi(NodeApi):
    """ResourceSlices of one driver on this node, and ResourceClaims."""

    def list_slices(self, driver: str) -> list[dict[str, Any]]:
        """This node's ResourceSlices of `driver` (filtered here too, whatever the server did)."""
        query = {"fieldSelector": f"spec.driver={driver},spec.nodeName={self.name}"}
        items, _ = self.list_objects("resourceslices", SLICES, query)
        return [
            s
            for s in read_list("resourceslices", items, read_slice)
            if s["spec"].get("driver") == driver and s["spec"].get("nodeName") == self.name
        ]

    def create_slice(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        # 409: an earlier attempt got through before its connection dropped; the next
        # publish compares again.
        self._call(
            f"create resourceslice {name}",
            _none_on(409, lambda: self._request("POST", SLICES, body=body)),
        )

    def patch_slice(self, name: str, body: dict[str, Any]) -> None:
        """A JSON merge patch: lists (devices, sharedCounters) are replaced whole."""
        path = SLICES + _path("/{name}", name=name)
        self._call(
            f"patch resourceslice {name}",
            lambda: self._request("PATCH", path, body=body, content_type=MERGE_PATCH),
        )

    def delete_slice(self, name: str) -> None:
        path = SLICES + _path("/{name}", name=name)
        self._call(
            f"delete resourceslice {name}", _none_on(404, lambda: self._request("DELETE", path))
        )

    def read_claim(
        self, namespace: str, name: str, budget_seconds: float | None = None
    ) -> dict[str, Any] | None:
        """A ResourceClaim as plain JSON, or None when there is no such claim. `budget_seconds`
        bounds the whole read, retries included (a prepare must answer before the kubelet's
        deadline). Raises KubeError."""
        path = _path(CLAIM, ns=namespace, name=name)
        timeout, retry = self._budget(budget_seconds)
        claim: dict[str, Any] | None = self._call(
            f"read resourceclaim {namespace}/{name}",
            _none_on(404, lambda: self._request("GET", path, timeout=timeout)),
            retry_seconds=retry,
        )
        return claim

    def pods_here(
        self, namespace: str, budget_seconds: float | None = None
    ) -> list[dict[str, Any]]:
        """This node's pods in `namespace` as plain JSON (the node filtered here too, whatever
        the server did): the consumers of a claim prepared here are among them. A list, not a
        get: the agent's role lists pods already (daemonset/base/rbac.yaml). `budget_seconds`
        bounds the whole list, retries included. Raises KubeError."""
        path = _path("/api/v1/namespaces/{ns}/pods", ns=namespace)
        query = {"fieldSelector": f"spec.nodeName={self.name}"}
        timeout, retry = self._budget(budget_seconds)
        result = self._call(
            f"list pods in {namespace}",
            lambda: self._request("GET", path, query=query, timeout=timeout),
            retry_seconds=retry,
        )
        items = result.get("items") if isinstance(result, dict) else None
        return [p for p in items or [] if _node_of(p) == self.name]

    def _budget(self, budget_seconds: float | None) -> tuple[float, float | None]:
        """(one request's timeout, how long to retry) for a call that `budget_seconds` bounds
        (None: the settings' own)."""
        timeout = self.settings.request_timeout_seconds
        if budget_seconds is None:
            return timeout, None
        timeout = max(0.1, min(timeout, budget_seconds))
        return timeout, max(0.0, budget_seconds - timeout)

    def update_claim_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        devices: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
        budget_seconds: float,
        claim: dict[str, Any] | None = None,
    ) -> bool:
        """Replace the claim's status.devices with `devices(claim)` (None: nothing to write),
        read-modify-write: an update of the status subresource (PUT, at the claim's
        resourceVersion) from `claim` as read (or read now); on a conflict the claim is read
        again and `devices` asked again. Not a patch: the v1.36 API server refuses every patch
        of the status of a claim whose allocation carries an opaque config ("status.allocation:
        field is immutable"; docs/dra.md, "Device status"). `budget_seconds` bounds the whole
        write, retries (logged at debug) included. False when the claim is gone or replaced
        (another UID); raises KubeError (the API server down, the write refused)."""
        path = _path(CLAIM, ns=namespace, name=name)
        # Half the budget at most for one request: the other half is for a retry (a conflict
        # is retried at once).
        timeout = max(0.1, min(self.settings.request_timeout_seconds, budget_seconds / 2))
        given = {"claim": claim}  # the first attempt's; every retry reads the claim again
        read = _none_on(404, lambda: self._request("GET", path, timeout=timeout))

        def attempt() -> bool:
            current = given.pop("claim", None) or read()
            if current is None or (current.get("metadata") or {}).get("uid") != uid:
                return False
            wanted = devices(current)
            if wanted is None:
                return True
            status = {k: v for k, v in (current.get("status") or {}).items() if k != "devices"}
            body = {**current, "status": {**status, **({"devices": wanted} if wanted else {})}}
            stored = _none_on(
                404, lambda: self._request("PUT", path + "/status", body=body, timeout=timeout)
            )()
            return stored is not None

        written: bool = self._call(
            f"write resourceclaim {namespace}/{name} status",
            attempt,
            retry_seconds=max(0.0, budget_seconds - timeout),
            quiet=True,
        )
        return written

    def claim_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, kind: str
    ) -> None:
        """An Event on a ResourceClaim, in its namespace. Raises KubeError."""
        body = claim_event_body(namespace, name, uid, reason, message, kind, self.name)
        path = _path("/api/v1/namespaces/{ns}/events", ns=namespace)
        self._call(
            f"create event {reason}", _none_on(409, lambda: self._request("POST", path, body=body))
        )

    def counters_kept(self, driver: str) -> bool:
        """Whether the API server keeps a ResourceSlice's counters (its DRAPartitionableDevices
        feature gate is on): a dry-run create of a slice with one counter set (nothing is
        stored), and its answer read back. Raises KubeError."""
        body = {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{self.name}-{driver}-counters-probe".lower()[:253]},
            "spec": {
                "driver": driver,
                "nodeName": self.name,
                "pool": {"name": self.name, "generation": 0, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "probe", "counters": {"probe": {"value": "1"}}}],
            },
        }
        what = "probe resourceslice counters"
        answer = self._call(
            what, lambda: self._request("POST", SLICES, body=body, query={"dryRun": "All"})
        )
        return bool(_stored(what, answer)["spec"].get("sharedCounters"))

    # -- writes read back: what the server stored (its DRAPartitionableDevices gate) ---------

    def create_slice_stored(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """`create_slice`, answering the ResourceSlice as the server stored it; None when it
        exists already (an earlier attempt got through before its connection dropped)."""
        what = f"create resourceslice {body['metadata']['name']}"
        stored = self._call(what, _none_on(409, lambda: self._request("POST", SLICES, body=body)))
        return None if stored is None else _stored(what, stored)

    def patch_slice_stored(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """`patch_slice`, answering the ResourceSlice as the server stored it."""
        path = SLICES + _path("/{name}", name=name)
        what = f"patch resourceslice {name}"
        return _stored(
            what,
            self._call(
                what, lambda: self._request("PATCH", path, body=body, content_type=MERGE_PATCH)
            ),
        )


def _stored(what: str, answer: object) -> dict[str, Any]:
    """The ResourceSlice a write's answer holds. Raises KubeError when it cannot be read (the
    publish fails, said in one sentence, and the next one writes again)."""
    try:
        if not isinstance(answer, dict):
            raise Unreadable("the answer is no ResourceSlice object", "")
        return read_slice(answer)
    except Unreadable as err:
        raise KubeError(f"Kubernetes API: {what}: the answer cannot be read: {err}") from None


def _node_of(pod: object) -> object:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    return spec.get("nodeName") if isinstance(spec, dict) else None


def claim_event_body(
    namespace: str, name: str, uid: str, reason: str, message: str, kind: str, host: str
) -> dict[str, Any]:
    """A core/v1 Event on a ResourceClaim (what `kubectl describe resourceclaim` shows)."""
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc)
    when = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{reason.lower()}.{now.strftime('%Y%m%d%H%M%S%f')}"},
        "involvedObject": {
            "apiVersion": API_VERSION, "kind": "ResourceClaim",
            "namespace": namespace, "name": name, "uid": uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": "nodeagent", "host": host},
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
    }  # fmt: skip
