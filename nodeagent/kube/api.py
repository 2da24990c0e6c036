"""The Kubernetes API as nodeagent uses it: its own Node, events, pods on this node.

Every call has a timeout and is retried with exponential backoff (tenacity) on conflicts,
throttling, server errors, timeouts and dropped connections; what still fails is a KubeError.

Requests go through the official client's REST layer (its Configuration, authentication,
TLS and connection pool: `kube/transport.py`) as plain JSON, not through `CoreV1Api`: since
kubernetes 37 every `CoreV1Api` method is validated with pydantic against the model classes,
and the first call imports ~250 of them (~21 MiB of the agent's memory) for objects nodeagent
reads as dicts; `ApiClient` and `Watch` (pydantic, the package's `__init__`) are not loaded
either.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_when_event_set,
    wait_random_exponential,
)

from nodeagent.base.errors import KubeError
from nodeagent.base.logs import get_logger
from nodeagent.base.shapes import MapOf, Shape, check
from nodeagent.kube.kubeconfig import configure, configure_in_cluster
from nodeagent.kube.objects import read_list
from nodeagent.kube.reconnect import Reconnect
from nodeagent.kube.transport import (
    ApiException,
    BadAnswer,
    Configuration,
    LineTooLong,
    Transport,
    describe_failure,
    json_lines,
)

log = get_logger("nodeagent.kube")
T = TypeVar("T")
RETRY_STATUS = {409, 429, 500, 502, 503, 504}
MERGE_PATCH = "application/merge-patch+json"
RETRY_FIRST_SECONDS = 0.25  # a retry's wait: up to this, doubled each attempt, up to the max
RETRY_MAX_SECONDS = 8.0


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist and watch again."""


def _retryable(err: BaseException) -> bool:
    if isinstance(err, ApiException):
        return err.status in RETRY_STATUS or (err.status == 0 and not _untrusted(err))
    if isinstance(err, urllib3.exceptions.SSLError) and _untrusted(err):
        return False  # the CA will not change within the retries
    return isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def _untrusted(err: BaseException) -> bool:
    """A server retries cannot change: its certificate is not the kubeconfig CA's (or is for
    another host, or expired), or it does not speak TLS."""
    said = describe_failure(err, "")
    return "its certificate" in said or "does not speak TLS" in said


def _describe(err: BaseException, host: str = "", timeout_seconds: float | None = None) -> str:
    """`err` in our words: the API server's own answer ("HTTP 403 Forbidden: ..."), or why it
    could not be reached (kube.transport.describe_failure)."""
    if isinstance(err, ApiException) and err.status:
        try:
            body = json.loads(err.body or "{}")
        except (ValueError, RecursionError):
            body = None
        message = body.get("message") if isinstance(body, dict) else None
        reason = err.reason if isinstance(err.reason, str) and err.reason.isprintable() else ""
        text = f"HTTP {err.status}" + (f" {reason}" if reason else "")
        if isinstance(message, str) and message:
            text += f": {message[:500]}"
        return text
    if isinstance(err, BadAnswer):
        return str(err)
    return describe_failure(err, host or "the server", timeout_seconds)


def _log_retry(
    what: str, state: RetryCallState, quiet: bool = False, host: str = "", timeout: float = 0
) -> None:
    """Every retry is logged: an unreachable API server is never silent."""
    err = state.outcome.exception() if state.outcome else None
    (log.debug if quiet else log.warning)(
        "kube.retry",
        call=what,
        attempt=state.attempt_number,
        error=_describe(err, host, timeout or None) if err is not None else "",
    )


@dataclass(frozen=True)
class CustomRef:
    """Where a namespaced custom resource lives: group, version, plural, namespace."""

    group: str
    version: str
    plural: str
    namespace: str


@dataclass(frozen=True)
class KubeSettings:
    node_name: str
    host: str | None = None  # tests: the emulator's URL; else in-cluster or kubeconfig
    kubeconfig: str | None = None
    request_timeout_seconds: float = 10.0
    exec_timeout_seconds: float = 30.0  # a kubeconfig's exec credential plugin
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"
    retry_seconds: float = 30.0
    watch_timeout_seconds: float = 60.0
    event_namespace: str = "default"


def make_api_client(settings: KubeSettings, stop: threading.Event | None = None) -> Transport:
    """The HTTP client for the cluster: a host (tests), a kubeconfig, or the in-cluster service
    account. Raises ConfigError for a kubeconfig or service account that cannot be used,
    KubeError for a kubeconfig's exec plugin that fails, hangs, or is stopped by `stop`."""
    cfg = Configuration()
    if settings.host:
        cfg.host = settings.host.rstrip("/")
    elif settings.kubeconfig:
        configure(
            cfg, settings.kubeconfig, settings.exec_timeout_seconds, stop or threading.Event()
        )
    else:
        configure_in_cluster(cfg, settings.service_account_dir)
    # Every retry is NodeApi's own (tenacity, each one logged): urllib3 would repeat a GET that
    # timed out 3 more times, silently (a slow API server: 40 s, then the call had failed).
    cfg.retries = False
    return Transport(cfg)


def _path(template: str, **params: str) -> str:
    """An API path with each `{name}` replaced by its URL-quoted value."""
    return template.format(**{k: quote(v, safe="") for k, v in params.items()})


def _name(obj: object) -> object:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta.get("name") if isinstance(meta, dict) else None


# The fields of a pod that the GPU clients' pause reads (nodeagent.kube.clients).
POD_FIELDS: Shape = {
    "metadata": {
        "name": str, "namespace": str, "labels": MapOf(str),
        "ownerReferences": [{"kind": str, "controller": bool}],
    },
    "spec": {"nodeName": str, "nodeSelector": MapOf(str)},
}  # fmt: skip


def pod_fields(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod`, once the fields read of it have their JSON types (its metadata and spec objects,
    empty where absent). Raises Unreadable."""
    meta = pod.get("metadata")
    where = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, dict) else ""
    check(pod, POD_FIELDS, f"pod {where}".rstrip())
    return {**pod, "metadata": pod.get("metadata") or {}, "spec": pod.get("spec") or {}}


def _none_on(status: int, call: Callable[[], T]) -> Callable[[], T | None]:
    """`call`, answering None where the API server answers `status` (404 absent, 409 exists)."""

    def run() -> T | None:
        try:
            return call()
        except ApiException as err:
            if err.status == status:
                return None
            raise

    return run


class NodeApi:
    """The agent's own Node and what happens on it."""

    def __init__(
        self,
        transport: Transport,
        settings: KubeSettings,
        stop: threading.Event | None = None,
        reconnect: Reconnect | None = None,
    ) -> None:
        self.transport = transport
        self.settings = settings
        self.name = settings.node_name
        # Retries end when the agent stops: SIGTERM during an API outage exits at once.
        self.stop_event = stop or threading.Event()
        self._watch: Any = None  # the open response of the running watch
        # The informers' way back after an outage: one for the agent, shared by its APIs.
        self.reconnect = reconnect or Reconnect()
        # Told every Node this API's patches stored (the watch's view keeps them: its own
        # patches coming back through the watch are then no news).
        self.on_node_patched: Callable[[dict[str, Any]], object] | None = None
        # Held from a patch's request until its answer is told: the watch can deliver the
        # patched Node before the patch's answer is read, and waits for it here.
        self.patching = threading.RLock()

    def interrupt(self) -> None:
        """The agent stops: end a watch blocked in its read (`end_watch`) and an informer's
        wait to reconnect (nodeagent.kube.reconnect)."""
        self.reconnect.interrupt()
        self.end_watch()

    def end_watch(self) -> None:
        """End a watch blocked in its read (from another thread): shut the response's socket
        down (urllib3 >= 2.3); the watch then ends as a dropped one."""
        shutdown = getattr(self._watch, "shutdown", None)
        if callable(shutdown):
            with contextlib.suppress(Exception):
                shutdown()

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)

    def _call(
        self,
        what: str,
        fn: Callable[[], T],
        retry_seconds: float | None = None,
        quiet: bool = False,
    ) -> T:
        """`fn` retried while the API server cannot answer, for `retry_seconds` (default: the
        settings'); each retry logged (at debug with `quiet`: a caller that says the failure
        itself, once). Raises KubeError."""
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            # Full jitter (a random wait up to the doubling ceiling): the nodes of a fleet
            # that lost the API server together do not come back to it together.
            wait=wait_random_exponential(multiplier=RETRY_FIRST_SECONDS, max=RETRY_MAX_SECONDS),
            stop=stop_after_delay(
                self.settings.retry_seconds if retry_seconds is None else retry_seconds
            )
            | stop_when_event_set(self.stop_event),
            sleep=self._sleep,
            before_sleep=lambda state: _log_retry(
                what, state, quiet, self._host, self.settings.request_timeout_seconds
            ),
            reraise=True,
        )
        try:
            return retrying(fn)
        except (
            ApiException, BadAnswer, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError
        ) as err:  # fmt: skip
            described = _describe(err, self._host, self.settings.request_timeout_seconds)
            raise KubeError(f"Kubernetes API: {what} failed: {described}") from err

    @property
    def _host(self) -> str:
        """The API server's URL, for what is said about it."""
        return str(getattr(getattr(self.transport, "configuration", None), "host", "") or "")

    def _request(self, method: str, path: str, **options: Any) -> Any:
        """`Transport.request` with this API's request timeout unless `timeout` is given."""
        if options.get("timeout") is None:
            options["timeout"] = self.settings.request_timeout_seconds
        return self.transport.request(method, path, **options)

    def get_node(self) -> dict[str, Any]:
        node: dict[str, Any] = self._call(
            f"read node {self.name}",
            lambda: self._request("GET", _path("/api/v1/nodes/{name}", name=self.name)),
        )
        return node

    def patch_node(self, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch: keys set to None are removed, other keys are untouched."""
        with self.patching:
            node: dict[str, Any] = self._call(
                f"patch node {self.name}",
                lambda: self._request(
                    "PATCH",
                    _path("/api/v1/nodes/{name}", name=self.name),
                    body=body,
                    content_type=MERGE_PATCH,
                ),
            )
            if self.on_node_patched is not None and isinstance(node, dict):
                self.on_node_patched(node)
        return node

    def list_objects(
        self, what: str, path: str, query: dict[str, str] | None = None
    ) -> tuple[list[Any], str | None]:
        """The items of the collection at `path` (as the server sent them: each is read by
        its caller) and the list's resourceVersion, to watch from. Raises KubeError."""
        result = self._call(f"list {what}", lambda: self._request("GET", path, query=query))
        if not isinstance(result, dict):
            raise KubeError(f"Kubernetes API: list {what}: the answer is not a list object")
        items, meta = result.get("items"), result.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return (
            list(items) if isinstance(items, list) else [],
            version if isinstance(version, str) and version else None,
        )

    def list_node(self) -> tuple[list[Any], str | None]:
        """This node as a list of one (field selector metadata.name; filtered here too) and
        the list's resourceVersion: the collection's, which a watch can start from even right
        after the API server restarted (the Node's own may be older than its watch cache)."""
        query = {"fieldSelector": f"metadata.name={self.name}"}
        items, version = self.list_objects(f"node {self.name}", "/api/v1/nodes", query)
        mine = [n for n in items if isinstance(n, dict) and _name(n) == self.name]
        return mine, version

    def watch_node(self, resource_version: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events of this node only (field selector metadata.name). Ends when the server or the
        read timeout ends the watch; raises WatchExpired on 410 and KubeError on other errors."""
        query = {"fieldSelector": f"metadata.name={self.name}"}
        for kind, data in self.watch(f"node {self.name}", "/api/v1/nodes", resource_version, query):
            if kind == "BOOKMARK" or _name(data) == self.name:
                yield kind, data

    def watch(
        self,
        what: str,
        path: str,
        resource_version: str | None,
        query: dict[str, str] | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) of a watch of the collection at `path` from `resource_version`,
        bookmarks included (their object carries the new resourceVersion). Ends when the server
        or the read timeout ends the watch; raises WatchExpired on 410 (relist and watch
        again) and KubeError on other errors."""
        timeout = self.settings.watch_timeout_seconds
        params = {
            **(query or {}),
            "timeoutSeconds": max(int(timeout), 1),
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version or None,
            "watch": "true",
        }
        response = None
        try:
            # The server ends the watch at timeoutSeconds; the read timeout catches a dead one.
            response = self._watch = self._request(
                "GET", path, query=params, timeout=timeout * 1.5 + 1, stream=True
            )
            for event in json_lines(response):
                kind, data = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR" and isinstance(data, dict):
                    if data.get("code") == 410:
                        raise WatchExpired(str(data.get("message", "")))
                    raise KubeError(
                        f"Kubernetes API: watch {what} failed: HTTP"
                        f" {data.get('code')} {data.get('reason', '')}: {data.get('message', '')}"
                    )
                yield kind, data
        except ApiException as err:
            if getattr(err, "status", None) == 410:
                raise WatchExpired(str(err)) from err
            raise KubeError(
                f"Kubernetes API: watch {what} failed: {_describe(err, self._host)}"
            ) from err
        except LineTooLong as err:
            raise KubeError(f"Kubernetes API: watch {what} failed: {err}") from err
        except ValueError as err:
            raise KubeError(f"Kubernetes API: watch {what}: not JSON: {err}") from err
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError) as err:
            if response is None and not self.stop_event.is_set():
                # Dropped before any answer: a failure (backed off), not a watch that ended.
                said = _describe(err, self._host, timeout * 1.5 + 1)
                raise KubeError(f"Kubernetes API: watch {what} failed: {said}") from err
            log.debug("watch.ended", reason=type(err).__name__)
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as err:
            # The watch could not start (the API server is down): the caller backs off.
            raise KubeError(f"Kubernetes API: watch {what} failed: {_describe(err)}") from err
        finally:
            self._watch = None
            if response is not None:  # closed first: a half-read stream is never reused
                response.close()
                response.release_conn()

    def event(self, reason: str, message: str, kind: str = "Normal") -> None:
        """A Kubernetes Event on this Node (what `kubectl describe node` shows)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = now.strftime("%Y%m%d%H%M%S%f")
        when = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.name}.{reason.lower()}.{stamp}"},
            "involvedObject": {"kind": "Node", "name": self.name, "uid": self.name},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "nodeagent", "host": self.name},
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }
        path = _path("/api/v1/namespaces/{ns}/events", ns=self.settings.event_namespace)
        # 409: an earlier attempt got through before its connection dropped.
        self._call(
            f"create event {reason}", _none_on(409, lambda: self._request("POST", path, body=body))
        )

    def list_pods_on_node(self, selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """The pods on this node (as plain JSON), those whose labels match `selector` if given."""
        label_selector = ",".join(f"{k}={v}" for k, v in sorted((selector or {}).items()))
        query = {"fieldSelector": f"spec.nodeName={self.name}", "labelSelector": label_selector}
        items, _ = self.list_objects("pods", "/api/v1/pods", {k: v for k, v in query.items() if v})
        pods = []
        for pod in read_list("pods", items, pod_fields):
            labels = pod["metadata"].get("labels") or {}
            # Filter here too: the selectors are what matters, whatever the server did.
            if pod["spec"].get("nodeName") == self.name and all(
                labels.get(k) == v for k, v in (selector or {}).items()
            ):
                pods.append(pod)
        return pods

    def pods_on_node(self, selector: dict[str, str]) -> list[tuple[str, str]]:
        """(namespace, name) of the pods on this node whose labels match `selector`."""
        return [
            (p["metadata"].get("namespace", ""), p["metadata"].get("name", ""))
            for p in self.list_pods_on_node(selector)
        ]

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod as plain JSON, or None when there is no such pod."""
        path = _path("/api/v1/namespaces/{ns}/pods/{name}", ns=namespace, name=name)
        pod: dict[str, Any] | None = self._call(
            f"read pod {namespace}/{name}", _none_on(404, lambda: self._request("GET", path))
        )
        return pod

    # -- custom resources (NFD's NodeFeature) -------------------------------------------------

    @staticmethod
    def _custom_path(ref: CustomRef, name: str = "") -> str:
        path = _path(
            "/apis/{group}/{version}/namespaces/{ns}/{plural}",
            group=ref.group, version=ref.version, ns=ref.namespace, plural=ref.plural,
        )  # fmt: skip
        return path + (_path("/{name}", name=name) if name else "")

    def get_custom(self, ref: CustomRef, name: str) -> dict[str, Any] | None:
        """A namespaced custom object, or None when it does not exist."""
        path = self._custom_path(ref, name)
        obj: dict[str, Any] | None = self._call(
            f"read {ref.plural} {ref.namespace}/{name}",
            _none_on(404, lambda: self._request("GET", path)),
        )
        return obj

    def create_custom(self, ref: CustomRef, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a namespaced custom object; None when it exists already (an earlier attempt
        got through before its connection dropped: the caller reads it again next time)."""
        name = body["metadata"]["name"]
        path = self._custom_path(ref)
        obj: dict[str, Any] | None = self._call(
            f"create {ref.plural} {ref.namespace}/{name}",
            _none_on(409, lambda: self._request("POST", path, body=body)),
        )
        return obj

    def patch_custom(self, ref: CustomRef, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge patch)."""
        path = self._custom_path(ref, name)
        obj: dict[str, Any] = self._call(
            f"patch {ref.plural} {ref.namespace}/{name}",
            lambda: self._request("PATCH", path, body=body, content_type=MERGE_PATCH),
        )
        return obj

    def delete_pod(self, namespace: str, name: str) -> None:
        path = _path("/api/v1/namespaces/{ns}/pods/{name}", ns=namespace, name=name)
        # 404: already gone is what we wanted.
        self._call(
            f"delete pod {namespace}/{name}", _none_on(404, lambda: self._request("DELETE", path))
        )
