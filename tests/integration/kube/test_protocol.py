"""The agent against a real HTTP Kubernetes API (kmock): labels, the mig.config protocol,
GPU clients paused and restored, faults, and a quiet steady state."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import build_agent
from nodeagent.agent.service import Agent
from nodeagent.nvml import read_inventory
from nodeagent.sim import SimulatedNvml
from tests.support.agent import Agents, emulated_node, generated_mig_file
from tests.support.cluster import EVENTS, NODES, Cluster, kmock, kube_group

NODE = "gpu-node-1"
STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
REASON = "nodeagent.io/mig.config.reason"


@pytest.fixture
def start_agent(
    cluster: Cluster, agents: Agents, tmp_path: Path
) -> Callable[..., tuple[Agent, SimulatedNvml]]:
    def start(
        clients: dict[str, Any] | None = None, labels: dict[str, str] | None = None
    ) -> tuple[Agent, SimulatedNvml]:
        cluster.add_node(NODE, {"kubernetes.io/hostname": NODE, "team": "ml", **(labels or {})})
        lib, session = emulated_node()
        mig = generated_mig_file(session, tmp_path / "mig.yaml")
        kube = kube_group(cluster, NODE, **(clients or {}))
        return agents.start(session, lib.reset, mig={"config_file": str(mig)}, kube=kube), lib

    return start


def _slices(lib: SimulatedNvml) -> list[int]:
    return [len(g.gis) for g in lib.state.gpus]


def test_labels_are_published_and_other_keys_untouched(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    start_agent()
    labels = cluster.wait(
        lambda: cluster.labels(NODE).get("nvidia.com/gpu.product") and cluster.labels(NODE),
        what="labels",
    )
    assert (
        labels["nvidia.com/gpu.product"] == "NVIDIA-H200" and labels["nvidia.com/gpu.count"] == "2"
    )
    assert labels["team"] == "ml" and labels["kubernetes.io/hostname"] == NODE
    owned = json.loads(cluster.annotations(NODE)["nodeagent.io/owned-labels"])
    assert "nvidia.com/gpu.product" in owned and "team" not in owned


def test_the_requests_it_sent_are_counted(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    agent, _ = start_agent()
    cluster.wait(lambda: "nvidia.com/gpu.product" in cluster.labels(NODE), what="first publish")
    node_writes = cluster.writes("/nodes/")  # the Node patches kmock received
    exposition = agent.exposition.latest().decode()
    counted = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("nodeagent_kube_requests_total{")
    }
    # (the count is the process's: other agents of this test process add to it)
    assert counted.get('code="200",resource="nodes",verb="patch"', 0) >= node_writes >= 1
    assert any('verb="watch"' in labels and 'resource="nodes"' in labels for labels in counted)


def test_mig_config_protocol_to_success(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    _, lib = start_agent()
    cluster.wait(lambda: "nvidia.com/gpu.product" in cluster.labels(NODE), what="first publish")
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert _slices(lib) == [4, 4]
    # Labels follow the state: published right after it.
    labels = cluster.wait(
        lambda: "nvidia.com/mig-1g.18gb.count" in cluster.labels(NODE) and cluster.labels(NODE),
        what="slice labels",
    )
    assert (
        labels["nvidia.com/mig-1g.18gb.count"] == "4"
        and labels["nvidia.com/mig-3g.71gb.count"] == "2"
    )
    assert REASON not in cluster.annotations(NODE)
    usage = json.loads(cluster.annotations(NODE)["nodeagent.io/mig.slices"])
    assert usage["1g.18gb"] == {"free": 4, "used": 0}
    reasons = [e["reason"] for e in cluster.events()]
    assert "MigConfigChanging" in reasons and "MigConfigApplied" in reasons
    states = [
        v.get("metadata", {}).get("labels", {}).get(STATE)
        for v in cluster.km.objects[NODES, None, NODE].history
        if v
    ]
    assert "pending" in states and states.index("pending") < states.index("success")
    # Stale labels go when the geometry changes.
    cluster.label(NODE, {CONFIG: "all-7g.141gb"})
    cluster.wait(
        lambda: cluster.labels(NODE).get("nvidia.com/mig-7g.141gb.count") == "2", what="7g labels"
    )
    assert not any(k.startswith("nvidia.com/mig-1g") for k in cluster.labels(NODE))
    assert cluster.labels(NODE)["team"] == "ml"


def test_unknown_config_fails_with_a_reason_and_changes_nothing(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    _, lib = start_agent()
    cluster.label(NODE, {CONFIG: "all-9g.999gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert "no config named 'all-9g.999gb'" in reason and "all-balanced" in reason
    assert _slices(lib) == [0, 0] and not any(g.mig_current for g in lib.state.gpus)
    # The Event follows the state label (a separate call): wait for it too.
    cluster.wait(
        lambda: any(e["reason"] == "MigConfigFailed" for e in cluster.events()), what="event"
    )
    warning = [e for e in cluster.events() if e["reason"] == "MigConfigFailed"]
    assert warning and warning[0]["type"] == "Warning" and "all-9g.999gb" in warning[0]["message"]
    # A new value is tried again.
    cluster.label(NODE, {CONFIG: "all-3g.71gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success after failure")
    assert REASON not in cluster.annotations(NODE)


def test_gpu_clients_are_paused_and_restored(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    deploy = "nvidia.com/gpu.deploy.device-plugin"
    cluster.add_pod("gpu-operator", "dp-1", NODE, {"app": "nvidia-device-plugin"})
    seen_paused = threading.Event()
    stop = threading.Event()

    def daemonset_controller() -> None:
        # Like the DaemonSet controller: the pod leaves while its node label is paused.
        while not stop.is_set():
            try:
                if cluster.labels(NODE).get(deploy) == "paused-for-mig-change":
                    seen_paused.set()
                    if (
                        PODS_KEY := (kmock.resource("v1/pods"), "gpu-operator", "dp-1")
                    ) in cluster.km.objects and not cluster.km.objects[PODS_KEY].deleted:
                        cluster.api.delete_namespaced_pod("dp-1", "gpu-operator")
            except Exception:
                pass
            time.sleep(0.05)

    helper = threading.Thread(target=daemonset_controller, daemon=True)
    helper.start()
    try:
        cluster.add_pod("gpu-operator", "exporter-1", NODE, {"app": "dcgm-exporter"})
        start_agent(
            {
                "pause_components": {"device-plugin": {"app": "nvidia-device-plugin"}},
                "restart_pods": ({"app": "dcgm-exporter"},),
                "clients_wait_seconds": 20,
            },
            labels={deploy: "true"},
        )
        cluster.label(NODE, {CONFIG: "all-balanced"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    finally:
        stop.set()
        helper.join(5)
    assert seen_paused.is_set()
    assert cluster.labels(NODE)[deploy] == "true"
    exporter = cluster.km.objects[kmock.resource("v1/pods"), "gpu-operator", "exporter-1"]
    assert exporter.deleted  # restarted so that it sees the new slices


def test_clients_that_never_leave_fail_the_change_and_are_restored(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    deploy = "nvidia.com/gpu.deploy.device-plugin"
    cluster.add_pod("gpu-operator", "dp-1", NODE, {"app": "nvidia-device-plugin"})
    _, lib = start_agent(
        {
            "pause_components": {"device-plugin": {"app": "nvidia-device-plugin"}},
            "clients_wait_seconds": 1,
        },
        labels={deploy: "true"},
    )
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    assert "did not leave the node" in cluster.annotations(NODE)[REASON]
    assert cluster.labels(NODE)[deploy] == "true"  # never left paused
    assert _slices(lib) == [0, 0]


def test_faults_are_retried_and_converge(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    err = kmock.KubernetesError
    patches = cluster.km["patch", NODES]
    done = len(list(patches))
    cluster.on_loop(
        lambda: (
            cluster.km["patch", NODES][done : done + 2]
            << err(status=500, reason="InternalError", message="etcd hiccup")
        )
    )
    cluster.on_loop(
        lambda: (
            cluster.km["patch", NODES][done + 2 : done + 3]
            << err(status=409, reason="Conflict", message="conflict")
        )
    )
    cluster.on_loop(
        lambda: cluster.km["patch", NODES][done + 3 : done + 4] << (lambda: asyncio.sleep(3))
    )
    cluster.on_loop(
        lambda: cluster.km["get", NODES][1:2] << err(status=503, reason="ServiceUnavailable")
    )

    def drop(request: object) -> bytes:
        # A dropped connection: close the socket under the request (kmock keeps the raw
        # aiohttp request on a private attribute; no public reaction does this).
        request._raw_request.transport.close()  # type: ignore[attr-defined]
        return b""

    cluster.on_loop(lambda: cluster.km["patch", NODES][done + 4 : done + 5] << drop)
    cluster.on_loop(lambda: cluster.km["post", EVENTS][0:1] << drop)
    expired = {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "code": 410,
            "reason": "Expired",
            "message": "too old resource version",
        },
    }
    # The first watch answers 410 Gone (one JSON event line, as the API server streams it).
    cluster.on_loop(
        lambda: cluster.km[kmock.action.WATCH, NODES][0:1] << (json.dumps(expired).encode() + b"\n")
    )
    agent, lib = start_agent(labels={CONFIG: "all-balanced"})  # asked before the agent starts
    cluster.wait(
        lambda: cluster.labels(NODE).get(STATE) == "success",
        timeout=60,
        what="success despite faults",
    )
    assert _slices(lib) == [4, 4]
    cluster.wait(
        lambda: cluster.labels(NODE).get("nvidia.com/mig-3g.71gb.count") == "2", what="labels"
    )
    watcher = agent.watcher
    assert watcher is not None
    cluster.wait(lambda: watcher.relists >= 1, what="a relist after 410")
    # The dropped event POST had reached the server: the retry's 409 counts as done, once.
    assert [e["reason"] for e in cluster.events()].count("MigConfigChanging") == 1


def _watches(cluster: Cluster) -> int:
    return sum(1 for r in list(cluster.km) if "watch=true" in str(r.url).lower())


def test_steady_state_writes_nothing(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    start_agent()
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    # Settled: the labels that follow the state are there.
    cluster.wait(lambda: "nvidia.com/mig-3g.71gb.count" in cluster.labels(NODE), what="labels")
    before = cluster.writes()
    watches_before = _watches(cluster)
    # Two watch cycles (1 s each) and inventory refreshes (0.5 s) later: still no write.
    cluster.wait(lambda: _watches(cluster) - watches_before >= 2, what="two more watches")
    assert cluster.writes() == before


def test_restart_with_the_config_already_applied_writes_nothing(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]], tmp_path: Path
) -> None:
    agent, lib = start_agent()
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    cluster.wait(lambda: "nvidia.com/mig-3g.71gb.count" in cluster.labels(NODE), what="labels")
    agent.stop()
    before = cluster.writes()
    again = build_agent(agent.session, agent.settings, lambda _s: lib.reset)
    again.start()  # the first reconcile and publish are done when start() returns
    try:
        # Two watch cycles (1 s each) and inventory refreshes (0.5 s) later: still no write.
        watches = _watches(cluster)
        cluster.wait(lambda: _watches(cluster) - watches >= 2, what="two more watches")
        assert cluster.writes() == before
        assert cluster.labels(NODE)[STATE] == "success"
    finally:
        again.stop()


def test_a_failed_value_is_tried_again_whenever_the_label_returns_to_it(
    cluster: Cluster, start_agent: Callable[..., tuple[Agent, SimulatedNvml]]
) -> None:
    """A ok, B refused (a slice in use), C ok, then B again: B is applied, not skipped as a
    value that failed once (the node stayed `success` with C on its GPUs)."""
    agent, lib = start_agent()
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="A applied")
    busy = read_inventory(agent.session).gpus[0].slices[0].mig_uuid
    assert busy is not None
    lib.attach(busy, 4242, 100 * 1024 * 1024)
    cluster.label(NODE, {CONFIG: "all-7g.141gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="B refused")
    assert "in use" in cluster.annotations(NODE)[REASON]
    lib.detach(4242)
    cluster.label(NODE, {CONFIG: "all-3g.71gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="C applied")
    assert _slices(lib) == [2, 2]
    cluster.label(NODE, {CONFIG: "all-7g.141gb"})
    cluster.wait(lambda: _slices(lib) == [1, 1], what="B applied when asked again")
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="B's success")
    assert REASON not in cluster.annotations(NODE)
