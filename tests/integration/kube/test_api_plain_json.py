"""The agent's side of the Kubernetes API sends and reads plain JSON through the official
client's `ApiClient` (imported as its users import it): every call nodeagent makes works
against a real HTTP API server, and none of them loads the typed API classes or the client's
model classes (27 MiB more of the agent's memory, kube/transport.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.cluster import Cluster

AGENT_SIDE = textwrap.dedent(
    """
    import json, sys
    from nodeagent.kube.api import KubeSettings, NodeApi, make_api_client
    settings = KubeSettings(
        node_name="gpu-1", host=sys.argv[1], retry_seconds=2, watch_timeout_seconds=2
    )
    api = NodeApi(make_api_client(settings), settings)
    node = api.get_node()
    api.patch_node({"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})
    api.event("MigConfigApplied", "all-balanced applied")
    pods = api.pods_on_node({"app": "nvidia-device-plugin-daemonset"})
    missing = api.read_pod("default", "no-such-pod")
    api.delete_pod("default", "no-such-pod")
    watched = [(kind, obj["metadata"]["name"]) for kind, obj in api.watch_node(None)]
    print(json.dumps({
        "node": node["metadata"]["name"],
        "pods": pods,
        "missing": missing,
        "watched": watched,
        "models": sorted(m for m in sys.modules if m.startswith("kubernetes.client.models.")),
        "core_v1": "kubernetes.client.api.core_v1_api" in sys.modules,
        "typed": sorted(m for m in sys.modules if m.startswith("kubernetes.client.api.")),
        "stand_ins": sorted(m for m in ("kubernetes", "kubernetes.client")
                            if getattr(sys.modules.get(m), "__file__", None) is None),
    }))
    """
)


def test_every_call_is_plain_json_without_the_model_classes(cluster: Cluster) -> None:
    cluster.add_node("gpu-1", {"nvidia.com/gpu.present": "true"})
    cluster.add_pod("gpu-operator", "dp-1", "gpu-1", {"app": "nvidia-device-plugin-daemonset"})
    cluster.add_pod("gpu-operator", "dp-2", "gpu-2", {"app": "nvidia-device-plugin-daemonset"})
    done = subprocess.run(
        [sys.executable, "-c", AGENT_SIDE, cluster.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["node"] == "gpu-1"
    assert seen["pods"] == [["gpu-operator", "dp-1"]]
    assert seen["missing"] is None
    assert ["ADDED", "gpu-1"] in seen["watched"]
    assert seen["models"] == [] and seen["core_v1"] is False
    assert seen["typed"] == []
    assert seen["stand_ins"] == []  # the real packages, their __init__ run
    assert cluster.labels("gpu-1")["nvidia.com/mig.config.state"] == "success"
    (event,) = [e for e in cluster.events() if e.get("reason") == "MigConfigApplied"]
    assert event["involvedObject"] == {"kind": "Node", "name": "gpu-1", "uid": "gpu-1"}
    assert event["message"] == "all-balanced applied"
    assert event["source"] == {"component": "nodeagent", "host": "gpu-1"}
