"""The agent's Kubernetes calls against a real HTTP API (kmock) that misbehaves: every call has a
timeout, every retry is nodeagent's own and logged, and a stop ends the retries."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.kube.api import KubeSettings, NodeApi, make_api_client
from tests.support.cli import captured_logs
from tests.support.cluster import NODES, PODS, Cluster, kmock

NODE = "n1"


def _api(cluster: Cluster, stop: threading.Event | None = None, **settings: Any) -> NodeApi:
    kube = KubeSettings(node_name=NODE, host=cluster.url, **settings)
    return NodeApi(make_api_client(kube), kube, stop)


def _slow(seconds: float) -> Any:
    return lambda: asyncio.sleep(seconds)


def _error(status: int) -> Any:
    return kmock.KubernetesError(status=status, reason="Failure", message=f"injected {status}")


@pytest.mark.parametrize(
    ("reaction", "words"),
    [
        # Slower than the request timeout (a slow API server): urllib3 used to repeat the GET
        # three times itself, silently, and the first logged retry came after 4 timeouts.
        (_slow(3), "no answer within"),
        (_error(500), "HTTP 500"),
        (_error(503), "HTTP 503"),
        (_error(429), "HTTP 429"),
    ],
    ids=["timeout", "500", "503", "429"],
)
def test_each_failed_attempt_is_logged_and_retried(
    cluster: Cluster, reaction: Any, words: str
) -> None:
    cluster.add_node(NODE, {"team": "ml"})
    cluster.on_loop(lambda: cluster.km["get", NODES][0:2] << reaction)
    api = _api(cluster, request_timeout_seconds=0.5, retry_seconds=30)
    with captured_logs("warning") as logs:
        node = api.get_node()
    assert node["metadata"]["labels"] == {"team": "ml"}
    retries = [e for e in logs if e["event"] == "kube.retry"]
    assert [r["attempt"] for r in retries] == [1, 2], retries
    assert all(words in r["error"] and r["call"] == f"read node {NODE}" for r in retries)
    gets = [r for r in list(cluster.km) if "/nodes/" in str(r.url)]
    assert len(gets) == 3  # two failed attempts and the answer: none repeated unseen


def test_an_api_that_never_answers_fails_once_the_retry_time_is_up(cluster: Cluster) -> None:
    cluster.add_node(NODE)
    cluster.on_loop(lambda: cluster.km["get", NODES] << _slow(30))
    api = _api(cluster, request_timeout_seconds=0.3, retry_seconds=1.5)
    with captured_logs("warning") as logs, pytest.raises(KubeError) as err:
        api.get_node()
    assert "read node n1 failed" in str(err.value) and "no answer within 0.3 s" in str(err.value)
    assert any(e["event"] == "kube.retry" for e in logs)


def test_a_stop_ends_the_retries(cluster: Cluster) -> None:
    cluster.add_node(NODE)
    cluster.on_loop(lambda: cluster.km["get", NODES] << _error(503))
    stop = threading.Event()
    api = _api(cluster, stop, retry_seconds=3600)
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(KubeError, match="HTTP 503"):
        api.get_node()  # returns (with the last error) instead of retrying for an hour
    assert stop.is_set()


def test_pods_that_cannot_be_read_are_skipped_and_said_once(cluster: Cluster) -> None:
    """The pods on the node (the GPU clients' pause reads them) go through the same shapes as
    every list the agent reads: items that are not objects, or labels that are a list, failed
    the whole read with Python's words."""
    cluster.add_pod("gpu", "app-1", NODE, {"app": "x"})
    pod = {"metadata": {"name": "app-1", "namespace": "gpu", "labels": {"app": "x"}},
           "spec": {"nodeName": NODE}}  # fmt: skip
    odd = {"metadata": {"name": "odd", "namespace": "gpu", "labels": ["app"]},
           "spec": {"nodeName": NODE}}  # fmt: skip
    answer = {"metadata": {"resourceVersion": "1"}, "items": ["garbage", odd, pod]}
    cluster.on_loop(lambda: cluster.km["list", PODS] << answer)
    api = _api(cluster)
    with captured_logs("warning") as logs:
        assert api.pods_on_node({"app": "x"}) == [("gpu", "app-1")]
        assert api.pods_on_node({"app": "x"}) == [("gpu", "app-1")]
    skipped = sorted(e["error"] for e in logs if e["event"] == "kube.object_skipped")
    assert skipped == [
        "a pods object is not a JSON object",
        "pod gpu/odd: metadata.labels is a list, not an object",
    ], skipped
