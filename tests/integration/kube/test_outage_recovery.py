"""A node's way back to an API server that was down (issue 39, class 2), against a real HTTP
API (kmock): the agent's two informers (its Node's, the ResourceClaims') run by supervised
workers as the agent wires them, through an outage of 35 s and the minute after it.

Time is scaled: a second of the scenario is SCALE seconds here (the informers' jittered pause,
the workers' own backoff, the outage and the minute), so the test takes a few seconds. While
the API server is down every request of the agent is answered 503; once it is back, the first
watch of each collection from a version the agent kept is answered 410 Gone, as a restarted
kube-apiserver's new watch cache answers it (its versions start after the agent's). Four nodes
lose the API server together, as a fleet does."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from nodeagent.agent.service import WATCH_BACKOFF_SECONDS
from nodeagent.dra.claims import checked_claim
from nodeagent.dra.k8s.allocated import claims_source
from nodeagent.dra.k8s.api import DraApi
from nodeagent.kube.api import KubeSettings, NodeApi, make_api_client
from nodeagent.kube.controller import NodeView, NodeWatcher
from nodeagent.kube.informer import Informer
from nodeagent.kube.reconnect import FIRST_SECONDS, MAX_SECONDS, Reconnect
from nodeagent.kube.transport import USER_AGENT
from nodeagent.state.workers import Worker
from tests.support.dra import CLAIMS, DraCluster, dra_cluster
from tests.support.wait import wait_for

kmock = pytest.importorskip("kmock")
NODES = ("n0", "n1", "n2", "n3")
SCALE = 0.1  # real seconds per second of the scenario (0.05 was too tight for a loaded 2-core CI)
OUTAGE_SECONDS = 35.0
BOUND = 20  # requests of a node in the first minute after the recovery


class Outage:
    """The API server down (503 to the agent's every request) and back, restarted (the first
    watch of each collection from a kept version: 410). Requests are logged with the moment
    they came, in seconds of the scenario."""

    def __init__(self, cluster: DraCluster) -> None:
        self.cluster = cluster
        self.down = False
        self.began = time.monotonic()
        # (at, node, verb, collection, answer); the node from the agent's User-Agent
        self.log: list[tuple[float, str, str, str, str]] = []
        self.restarted: set[str] = set()  # the collections whose kept versions expired
        self._expired: set[tuple[str, str]] = set()  # (agent, collection) answered 410
        self._lock = threading.Lock()
        self._decided: dict[int, str] = {}  # request id -> its answer (kmock asks twice)
        down = kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="down")
        gone = kmock.KubernetesError(status=410, reason="Expired", message="too old")
        cluster.on_loop(lambda: cluster.km[lambda r: self._decide(r) == "503"] << down)
        cluster.on_loop(lambda: cluster.km[lambda r: self._decide(r) == "410"] << gone)

    def now(self) -> float:
        return (time.monotonic() - self.began) / SCALE

    def _decide(self, request: Any) -> str:
        """How the API server answers `request`: 503 while down, 410 for the first watch of a
        collection from a kept version once back, else served (by the emulator). Only the
        agent's requests are logged and answered so: the test's own writes go through."""
        agent = str(request.headers.get("User-Agent", ""))
        if not agent.startswith(USER_AGENT):
            return "served"
        with self._lock:
            if request.id in self._decided:
                return self._decided[request.id]
            watch = request.params.get("watch") == "true"
            collection = "nodes" if "/nodes" in request.url.path else "resourceclaims"
            verb = "watch" if watch else str(getattr(request.method, "value", request.method))
            answer = "served"
            if self.down:
                answer = "503"
            elif (
                watch
                and request.params.get("resourceVersion")
                and collection in self.restarted
                and (agent, collection) not in self._expired
            ):
                self._expired.add((agent, collection))
                answer = "410"
            self._decided[request.id] = answer
            node = agent[len(USER_AGENT) :].strip()
            self.log.append((self.now(), node, verb.lower(), collection, answer))
            return answer

    def begin(self) -> None:
        with self._lock:
            self.down = True
            self.restarted = {"nodes", "resourceclaims"}
            self.began = time.monotonic()

    def end(self) -> float:
        with self._lock:
            self.down = False
        return self.now()

    def requests(self, node: str, since: float, until: float) -> list[tuple[float, str, str, str]]:
        """(at, verb, collection, answer) of `node`'s requests from `since` until `until`."""
        with self._lock:
            return [(r[0], *r[2:]) for r in self.log if r[1] == node and since <= r[0] < until]


class Claims:
    """The claims informer's handler: when each claim was first heard of."""

    def __init__(self, outage: Outage) -> None:
        self.outage = outage
        self.heard: dict[str, float] = {}

    def listed(self, objects: Sequence[dict[str, Any]]) -> None:
        for claim in objects:
            self.changed("ADDED", claim)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        self.heard.setdefault(obj["metadata"]["name"], self.outage.now())


class Node:
    """One node's informers, each run by a worker as the agent runs its kube-watch and
    dra-bind workers (the worker's own backoff: WATCH_BACKOFF_SECONDS), time scaled."""

    def __init__(self, cluster: DraCluster, outage: Outage, name: str) -> None:
        self.name = name
        self.stop = threading.Event()
        kube = KubeSettings(
            node_name=name, host=cluster.url, retry_seconds=0, watch_timeout_seconds=1
        )
        # One Reconnect, two APIs (each with its watch), as the agent wires them.
        reconnect = Reconnect(FIRST_SECONDS * SCALE, MAX_SECONDS * SCALE)
        self.node_api = NodeApi(make_api_client(kube), kube, self.stop, reconnect)
        self.api = DraApi(make_api_client(kube), kube, self.stop, reconnect)
        for api in self.apis:
            api.transport.api.user_agent = f"{USER_AGENT} {name}"  # told apart in the log
        self.watcher = NodeWatcher(self.node_api, NodeView(), lambda: None, self.stop)
        self.claims = Claims(outage)
        self.informer = Informer(
            claims_source(self.api), checked_claim, self.claims, self.stop, reconnect=reconnect
        )
        self.workers = [
            self._worker("kube-watch", self.watcher.cycle, lambda: 0.0),
            self._worker("dra-bind", self.informer.run, lambda: 1.0 * SCALE),
        ]

    def _worker(self, name: str, work: Callable[[], None], interval: Callable[[], float]) -> Worker:
        return Worker(
            name, work, interval, self.stop, max_backoff_seconds=WATCH_BACKOFF_SECONDS * SCALE
        )

    @property
    def apis(self) -> tuple[NodeApi, DraApi]:
        return self.node_api, self.api

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def close(self) -> None:
        self.stop.set()
        for api in self.apis:
            api.interrupt()
        for worker in self.workers:
            worker.wake()
            worker.join(10)


@pytest.fixture
def fleet() -> Iterator[tuple[list[Node], Outage, DraCluster]]:
    cluster = dra_cluster()
    outage = Outage(cluster)
    nodes = []
    try:
        for name in NODES:
            cluster.add_node(name)
            nodes.append(Node(cluster, outage, name))
            nodes[-1].start()
        yield nodes, outage, cluster
    finally:
        for n in nodes:
            n.close()
        cluster.close()


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": []}},
    }


def test_after_an_outage_each_node_lists_once_and_the_fleet_comes_back_spread(
    fleet: tuple[list[Node], Outage, DraCluster],
) -> None:
    nodes, outage, cluster = fleet
    wait_for(lambda: all(n.watcher.informer.version and n.informer.version for n in nodes),
             "every node watching", 10)  # fmt: skip

    outage.begin()
    for api in (api for n in nodes for api in n.apis):
        api.end_watch()  # the server went away: the open watches drop with it
    time.sleep(OUTAGE_SECONDS / 2 * SCALE)
    cluster.on_loop(lambda: cluster.km.objects.__setitem__((CLAIMS, "ns", "made"), _claim("made")))
    time.sleep(OUTAGE_SECONDS / 2 * SCALE)
    back = outage.end()
    time.sleep(70 * SCALE)

    gaps: list[list[float]] = []  # of each watch of the fleet: between its failed attempts
    for n in nodes:
        during = [r for r in outage.requests(n.name, 0, back) if r[3] == "503"]
        after = outage.requests(n.name, back, back + 60)
        assert len(after) < BOUND, after
        lists = sorted(res for _, verb, res, _ in after if verb == "get")
        assert lists == ["nodes", "resourceclaims"], after  # each listed once
        # Each watch tried again at a backoff growing to 30 s: a handful, not one a second.
        assert len(during) <= 2 * 10, during
        # The claim made in the outage is heard of once the first of the node's watches is
        # back (the other's pause ends then), not after the claims watch's own backoff.
        first = min(at for at, *_ in after)
        assert n.claims.heard["made"] - first < 10.0, (n.name, n.claims.heard, first, after)
        for collection in ("nodes", "resourceclaims"):
            tried = [at for at, _, res, _ in during if res == collection]
            gaps.append([b - a for a, b in itertools.pairwise(tried)])
    # Jittered: the watches of nodes that lost the API server together do not ask again at the
    # same moments. Without jitter the k-th wait was 2^(k-1) s on every node (1, 2, 4, 8, 16:
    # the fleet came back in one instant); with it, a random wait up to that.
    spreads = [
        max(g[k] for g in gaps if len(g) > k) - min(g[k] for g in gaps if len(g) > k)
        for k in range(max(len(g) for g in gaps))
    ]
    assert max(spreads) > 3.0, gaps
