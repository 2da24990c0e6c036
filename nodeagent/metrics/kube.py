"""The agent's requests to the Kubernetes API server, counted where they are sent
(nodeagent.kube.transport) and exported with --kube:

    nodeagent_kube_requests_total{verb,resource,code}   counter

`verb` as the API server's audit log names it (get, list, watch, create, patch, update,
delete), `resource` the object kind's plural (nodes, events, resourceslices, ...), `code` the
HTTP status, or `error` where no answer came. What a fleet of agents asks of the API server is
the sum over the nodes (benchmarks/fleet.py); a node at steady state asks only its watches.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric


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

    def __init__(self, requests: KubeRequests) -> None:
        self.requests = requests

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
