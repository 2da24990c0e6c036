"""The agent's requests to the Kubernetes API server, counted where they are sent
(nodeagent.kube.transport) and exported with --kube:

    nodeagent_kube_requests_total{verb,resource,code}   counter
    nodeagent_kube_objects_skipped_total{resource,field}   counter
    nodeagent_kube_object_unreadable{resource,namespace,name,field}   gauge (1)

`verb` as the API server's audit log names it (get, list, watch, create, patch, update,
delete), `resource` the object kind's plural (nodes, events, resourceslices, ...), `code` the
HTTP status, or `error` where no answer came. What a fleet of agents asks of the API server is
the sum over the nodes (benchmarks/fleet.py); a node at steady state asks only its watches.

An object of a list or watch that the agent cannot read (a field of the wrong JSON type:
nodeagent.kube.informer) is skipped: counted once when it is first skipped, by its resource and
the field that is wrong, and named by the gauge for as long as it stays unreadable.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class KubeRequests:
    """Counts by (verb, resource, code); thread-safe. One for the process (KUBE_REQUESTS):
    every API client of the agent sends through the same transport code."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, method: str, path: str, watch: bool, code: str) -> None:
        key = (verb_of(method, path, watch), resource_of(path), code)
        with self._lock:
            self._counts[key] += 1

    def counts(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._counts)


KUBE_REQUESTS = KubeRequests()
ObjectKey = tuple[str, str, str]  # resource, namespace ('' if cluster-scoped), name


class SkippedObjects:
    """The objects skipped as unreadable, by (resource, namespace, name) -> the wrong field;
    thread-safe. One for the process (KUBE_SKIPPED): every reader of a resource (a watch, a
    list) says an object once between them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: dict[ObjectKey, str] = {}
        self._counts: Counter[tuple[str, str]] = Counter()

    def skipped(self, key: ObjectKey, field: str) -> bool:
        """Record `key` as unreadable at `field`; True when that is news (say it)."""
        with self._lock:
            if self._now.get(key) == field:
                return False
            self._now[key] = field
            self._counts[(key[0], field)] += 1
            return True

    def readable(self, key: ObjectKey) -> bool:
        """`key` was read (or is gone); True when it had been skipped."""
        with self._lock:
            return self._now.pop(key, None) is not None

    def listed(self, resource: str, keys: set[ObjectKey]) -> list[ObjectKey]:
        """A full list of `resource` held `keys`: the skipped ones it lacks are gone (they
        are forgotten and returned)."""
        with self._lock:
            gone = [k for k in self._now if k[0] == resource and k not in keys]
            for key in gone:
                del self._now[key]
            return gone

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def now(self) -> dict[ObjectKey, str]:
        with self._lock:
            return dict(self._now)


KUBE_SKIPPED = SkippedObjects()


def _parts(path: str) -> list[str]:
    """The path's segments after the API version: ['nodes', 'n1'], ['namespaces', 'ns',
    'events'], ..."""
    segments = [s for s in path.split("?", 1)[0].split("/") if s]
    if segments[:1] == ["api"]:
        return segments[2:]
    if segments[:1] == ["apis"]:
        return segments[3:]
    return segments


def resource_of(path: str) -> str:
    parts = _parts(path)
    if len(parts) >= 3 and parts[0] == "namespaces":
        return parts[2]
    return parts[0] if parts else "unknown"


def verb_of(method: str, path: str, watch: bool) -> str:
    method = method.upper()
    if method == "GET":
        if watch:
            return "watch"
        parts = _parts(path)
        named = (
            len(parts) >= 4 if parts[:1] == ["namespaces"] and len(parts) >= 3 else len(parts) >= 2
        )
        return "get" if named else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(
        method, method.lower()
    )


class KubeCollector:
    name = "kube"

    def __init__(self, requests: KubeRequests, skipped: SkippedObjects = KUBE_SKIPPED) -> None:
        self.requests = requests
        self.skipped = skipped

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "nodeagent_kube_requests",
            "Requests the agent sent to the Kubernetes API server, by verb, resource and HTTP"
            " status ('error': no answer).",
            labels=["verb", "resource", "code"],
        )
        for (verb, resource, code), n in sorted(self.requests.counts().items()):
            family.add_metric([verb, resource, code], n)
        yield family
        skipped = CounterMetricFamily(
            "nodeagent_kube_objects_skipped",
            "Objects of the API server's lists and watches the agent skipped because a field it"
            " reads has the wrong JSON type, by resource and field (once per object).",
            labels=["resource", "field"],
        )
        for (resource, field), n in sorted(self.skipped.counts().items()):
            skipped.add_metric([resource, field], n)
        yield skipped
        unreadable = GaugeMetricFamily(
            "nodeagent_kube_object_unreadable",
            "1 for each object the agent skips now as unreadable, and the field that is wrong.",
            labels=["resource", "namespace", "name", "field"],
        )
        for (resource, namespace, name), field in sorted(self.skipped.now().items()):
            unreadable.add_metric([resource, namespace, name, field], 1)
        yield unreadable
