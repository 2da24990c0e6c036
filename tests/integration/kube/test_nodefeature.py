"""The NFD NodeFeature sink against a real HTTP Kubernetes API (kmock): the object GFD writes
(NVIDIA/k8s-device-plugin 1b826acc, internal/lm/output.go) is created, updated when the labels
change, never written when they do not, and owned by the agent's DaemonSet and pod."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from tests.support.agent import Agents, emulated_node, generated_mig_file
from tests.support.cluster import PODS, Cluster, kmock, kube_group

NODE = "gpu-node-1"
NAMESPACE = "nodeagent"
POD = "nodeagent-x7k2p"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
NODEFEATURES = kmock.resource("nfd.k8s-sigs.io/v1alpha1/nodefeatures")
OBJECT = f"nvidia-features-for-{NODE}"

Start = Callable[..., Agent]


@pytest.fixture
def start_agent(cluster: Cluster, agents: Agents, tmp_path: Path) -> Start:
    def start(**kube: Any) -> Agent:
        cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
        lib, session = emulated_node()
        mig = generated_mig_file(session, tmp_path / "mig.yaml")
        return agents.start(
            session,
            lib.reset,
            mig={"config_file": str(mig)},
            kube=kube_group(cluster, NODE, node_feature_api=True, pod_namespace=NAMESPACE, **kube),
        )

    return start


def _add_agent_pod(cluster: Cluster) -> None:
    """The agent's own pod, as the DaemonSet controller creates it."""
    cluster.km.objects[PODS, NAMESPACE, POD] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": NAMESPACE,
            "uid": "pod-uid-1",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": "nodeagent",
                    "uid": "ds-uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "nodeagent", "image": "nodeagent"}]},
    }


def _object(cluster: Cluster) -> dict[str, Any] | None:
    key = (NODEFEATURES, NAMESPACE, OBJECT)
    if key not in cluster.km.objects or cluster.km.objects[key].deleted:
        return None
    return dict(cluster.km.objects[key])


def _writes(cluster: Cluster) -> int:
    return cluster.writes("/nodefeatures")


def _published(cluster: Cluster) -> dict[str, str]:
    """The labels nodeagent put on the Node itself (the other sink)."""
    return {k: v for k, v in cluster.labels(NODE).items() if k.startswith("nvidia.com/gpu.")}


def test_created_with_the_labels_nfd_needs_and_owned_by_the_daemonset_and_pod(
    cluster: Cluster, start_agent: Start
) -> None:
    _add_agent_pod(cluster)
    start_agent(pod_name=POD)
    obj = cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1" and obj["kind"] == "NodeFeature"
    meta = obj["metadata"]
    assert meta["name"] == OBJECT and meta["namespace"] == NAMESPACE
    assert meta["labels"] == {"nfd.node.kubernetes.io/node-name": NODE}
    owners = {
        (o["kind"], o["name"], o["uid"], o.get("controller")) for o in meta["ownerReferences"]
    }
    assert owners == {
        ("DaemonSet", "nodeagent", "ds-uid-1", True),
        ("Pod", POD, "pod-uid-1", None),
    }
    labels = obj["spec"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "2"
    # The same labels as on the Node (the Node-patch sink stays).
    cluster.wait(lambda: _published(cluster), what="node labels")
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.")} == _published(
        cluster
    )
    assert obj["spec"]["features"] == {"flags": {}, "attributes": {}, "instances": {}}


def test_updated_when_the_labels_change_and_not_written_when_they_do_not(
    cluster: Cluster, start_agent: Start
) -> None:
    agent = start_agent()
    cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    cluster.wait(lambda: _writes(cluster) == 1, what="the create in the request log")
    # Steady state: reconciles publish the same labels; the object is not written.
    agent.pipeline.run_once()
    agent.pipeline.run_once()
    assert _writes(cluster) == 1
    # A MIG change: the slice labels appear on the object (one merge patch).
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    obj = cluster.wait(
        lambda: (
            (o := _object(cluster)) and "nvidia.com/mig-1g.18gb.count" in o["spec"]["labels"] and o
        ),
        what="slice labels on the object",
    )
    assert obj["spec"]["labels"]["nvidia.com/mig-3g.71gb.count"] == "2"
    changed = _writes(cluster)
    assert changed >= 2
    # Back to no MIG: labels that no longer apply are removed from the object.
    cluster.label(NODE, {CONFIG: "all-disabled"})
    cluster.wait(
        lambda: (
            (o := _object(cluster)) and "nvidia.com/mig-1g.18gb.count" not in o["spec"]["labels"]
        ),
        what="slice labels gone",
    )
    settled = _writes(cluster)
    agent.pipeline.run_once()
    assert _writes(cluster) == settled


def test_no_owner_when_the_pod_is_unknown(cluster: Cluster, start_agent: Start) -> None:
    start_agent()  # no POD_NAME
    obj = cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    assert obj["metadata"].get("ownerReferences") in (None, [])


def test_a_pod_that_cannot_be_read_is_owner_by_its_uid_alone(
    cluster: Cluster, start_agent: Start
) -> None:
    """The downward API's POD_UID is enough for the pod's reference."""
    cluster.on_loop(lambda: cluster.km.resources.__setitem__(PODS, {}))
    start_agent(pod_name="gone-pod", pod_uid="uid-from-downward-api")
    obj = cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    assert [(o["kind"], o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
        ("Pod", "gone-pod", "uid-from-downward-api")
    ]


def test_a_deleted_object_is_created_again(cluster: Cluster, start_agent: Start) -> None:
    agent = start_agent()
    cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    cluster.on_loop(lambda: cluster.km.objects[NODEFEATURES, NAMESPACE, OBJECT].delete())
    assert _object(cluster) is None
    agent.pipeline.run_once()
    assert _object(cluster) is not None


def test_owners_the_api_refused_to_tell_are_added_once_it_does(
    cluster: Cluster, start_agent: Start
) -> None:
    """RBAC not yet in place when the agent starts (403 on its pod): the object is owned by the
    pod alone (downward-API UID); the DaemonSet is added at a later publish."""
    _add_agent_pod(cluster)
    cluster.on_loop(
        lambda: (
            cluster.km["get", PODS][0:1]
            << kmock.KubernetesError(status=403, reason="Forbidden", message="pods is forbidden")
        )
    )
    agent = start_agent(pod_name=POD, pod_uid="pod-uid-1")
    obj = cluster.wait(lambda: _object(cluster), what="the NodeFeature object")
    assert [o["kind"] for o in obj["metadata"]["ownerReferences"]] == ["Pod"]
    agent.pipeline.run_once()
    owners = _object(cluster)["metadata"]["ownerReferences"]  # type: ignore[index]
    assert [(o["kind"], o["uid"]) for o in owners] == [
        ("DaemonSet", "ds-uid-1"),
        ("Pod", "pod-uid-1"),
    ]
    settled = _writes(cluster)
    agent.pipeline.run_once()
    assert _writes(cluster) == settled


def test_without_nfds_crd_the_failure_says_what_to_do(cluster: Cluster, start_agent: Start) -> None:
    cluster.on_loop(
        lambda: (
            cluster.km["post", NODEFEATURES]
            << kmock.KubernetesError(
                status=404,
                reason="NotFound",
                message="the server could not find the requested resource",
            )
        )
    )
    agent = start_agent()
    ready, reason = agent.ready()
    assert not ready
    assert reason.startswith("publish: nodefeature: Kubernetes API: create nodefeatures nodeagent/")
    assert "is node-feature-discovery's NodeFeature CRD installed?" in reason
    # The Node itself still gets its labels.
    cluster.wait(lambda: _published(cluster), what="node labels")
