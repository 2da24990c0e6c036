"""Device taints against the real API server and kube-scheduler (v1.36.2, DRADeviceTaints on):
the API server keeps the taints nodeagent writes (and the time it sends, so a restart writes
nothing), the scheduler gives a pod's claim another device or leaves it Pending while a device
is tainted NoSchedule, a claim that tolerates the taint gets the device, and a NoExecute taint
evicts the pod of a claim allocated the device (the controller manager's device-taint
eviction)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from nodeagent.nvml import read_inventory
from nodeagent.state.faults import Fault, FaultKey
from tests.k8s.test_dra_real import _template
from tests.k8s.test_gates_real import _plugin, _stored
from tests.k8s.test_packing_real import _allocated, _device_classes, _pod, _wait
from tests.support.k8s import ControlPlane, make_node

KEY = "gpu.nodeagent.io/unhealthy"
XID_79 = {FaultKey(0): Fault(("xid-79",), time.time() - 5)}


def _tolerant(namespace: str, effect: str) -> dict[str, Any]:
    toleration = {"key": KEY, "operator": "Exists", "effect": effect}
    request = {"deviceClassName": "gpu.nodeagent.io", "tolerations": [toleration]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tolerant", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def _unschedulable(core: Any, namespace: str, pod: str) -> bool:
    conditions = core.read_namespaced_pod(pod, namespace).status.conditions or []
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)


def test_a_tainted_gpu_is_left_out_unless_tolerated(
    api_client: Any, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(api_client, node)
    plugin, session = _plugin(tmp_path, control_plane, node)
    assert plugin.publish(read_inventory(session), XID_79) is True
    stored = _stored(plugin)[f"{node}-gpu-nodeagent-io-gpu-0"]["devices"]
    assert {d["name"]: d["taints"][0]["value"] for d in stored} == {
        d["name"]: "xid-79" for d in stored
    }  # the GPU and its 25 MIG devices, as sent
    assert stored[0]["taints"][0]["effect"] == "NoSchedule"
    assert not any(
        "taints" in d for d in _stored(plugin)[f"{node}-gpu-nodeagent-io-gpu-1"]["devices"]
    )
    again, session2 = _plugin(tmp_path, control_plane, node)  # a restart: the same taints
    assert again.publish(read_inventory(session2), XID_79) is False
    assert again.publisher.writes == 0

    _device_classes(api_client)
    res.create_namespaced_resource_claim_template(namespace, _template("whole-gpu", namespace))
    res.create_namespaced_resource_claim_template(namespace, _tolerant(namespace, "NoSchedule"))
    whole = {"resourceClaimTemplateName": "whole-gpu"}
    core.create_namespaced_pod(namespace, _pod("a", node, whole))
    claim_a = _wait("pod a's claim allocated", lambda: _claim_of(core, namespace, "a"))
    _wait("a allocated", lambda: _allocated(res, namespace, claim_a))
    assert _allocated(res, namespace, claim_a) == "gpu-1"  # not the tainted gpu-0
    core.create_namespaced_pod(namespace, _pod("b", node, whole))
    _wait("pod b unschedulable", lambda: _unschedulable(core, namespace, "b"))
    claim_b = _claim_of(core, namespace, "b")
    assert claim_b is None or _allocated(res, namespace, claim_b) is None

    core.create_namespaced_pod(
        namespace, _pod("c", node, {"resourceClaimTemplateName": "tolerant"})
    )
    claim_c = _wait("pod c's claim", lambda: _claim_of(core, namespace, "c"))
    assert _wait("c allocated", lambda: _allocated(res, namespace, claim_c)) == "gpu-0"

    # gpu-1 fails fatally: NoExecute evicts pod a (whose claim does not tolerate it).
    fatal = {**XID_79, FaultKey(1): Fault(("xid-48",), time.time())}
    started = time.monotonic()
    assert plugin.publish(read_inventory(session), fatal, ("xid-48",)) is True
    print(f"a taint's ResourceSlice write (3 slices): {time.monotonic() - started:.3f} s")
    _wait(
        "pod a evicted",
        lambda: _gone_or_deleting(core, namespace, "a"),
        seconds=60,
    )
    assert not _gone_or_deleting(core, namespace, "c")  # tolerates NoSchedule only, on gpu-0
    session.close()
    session2.close()


def _claim_of(core: Any, namespace: str, pod: str) -> str | None:
    statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses or []
    return next((s.resource_claim_name for s in statuses if s.resource_claim_name), None)


def _gone_or_deleting(core: Any, namespace: str, pod: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_pod(pod, namespace).metadata.deletion_timestamp is not None
    except ApiException as err:
        if err.status == 404:
            return True
        raise
