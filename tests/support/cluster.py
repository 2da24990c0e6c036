"""A real HTTP Kubernetes API for the tests: kmock's KubernetesEmulator on loopback, run on
its own event loop in a thread so that the agent's (synchronous) kubernetes client talks to it
exactly as to a real API server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.support.wait import wait_for

kmock = pytest.importorskip("kmock")
NODES = kmock.resource("v1/nodes")
PODS = kmock.resource("v1/pods")
EVENTS = kmock.resource("v1/events")
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def is_write(request: Any) -> bool:
    # kmock's method is an enum: str() of it is 'method.POST', its value is 'POST'.
    return str(getattr(request.method, "value", request.method)).upper() in WRITES


class Cluster:
    """The emulator, its URL, and a client for the test's own (user's) requests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "kmock did not start"
        cfg = client.Configuration()
        cfg.host = self.url.rstrip("/")
        self.api = client.CoreV1Api(client.ApiClient(cfg))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        async with kmock.KubernetesEmulator() as km, kmock.Server(km) as server:
            self.km, self.url = km, str(server.url)
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the emulator's loop (to add reactions safely) and return its result."""
        result: list[Any] = []
        done = threading.Event()

        def call() -> None:
            result.append(fn())
            done.set()

        self.loop.call_soon_threadsafe(call)
        assert done.wait(10)
        return result[0]

    # -- the cluster state, as a user sees it ---------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.km.objects[NODES, None, name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": {}},
        }

    def add_pod(self, namespace: str, name: str, node: str, labels: dict[str, str]) -> None:
        self.km.objects[PODS, namespace, name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "example/gpu-app"}],
            },
        }

    def node(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = self.api.api_client.sanitize_for_serialization(
            self.api.read_node(name)
        )
        return data

    def labels(self, name: str) -> dict[str, str]:
        return self.node(name)["metadata"].get("labels") or {}

    def annotations(self, name: str) -> dict[str, str]:
        return self.node(name)["metadata"].get("annotations") or {}

    def label(self, name: str, changes: dict[str, str | None]) -> None:
        """What `kubectl label node` does."""
        self.api.patch_node(
            name, {"metadata": {"labels": changes}}, _content_type="application/merge-patch+json"
        )

    def events(self) -> list[dict[str, Any]]:
        return [
            dict(obj)
            for (res, _, _), obj in list(self.km.objects.items())
            if res == EVENTS and not obj.deleted
        ]

    def writes(self, path: str = "") -> int:
        """Requests that wrote (POST, PUT, PATCH, DELETE), to URLs containing `path`."""
        return sum(1 for r in list(self.km) if is_write(r) and path in str(r.url))

    def wait(self, predicate: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
        return wait_for(predicate, what or str(predicate), timeout)


def kube_group(cluster: Cluster, node: str, **extra: Any) -> dict[str, Any]:
    """The kube settings of an agent on `node` of `cluster` (a 1 s watch, no kubelet)."""
    return {
        "enabled": True,
        "node_name": node,
        "host": cluster.url,
        "watch_timeout_seconds": 1,
        "pod_resources_socket": None,
        **extra,
    }
