"""Extended resources served by nodeagent's DRA driver (KEP-5004, DRAExtendedResource) against
the real kube-scheduler v1.36.2: an unchanged pod asking `nvidia.com/gpu: 1` or
`nvidia.com/mig-1g.18gb: 1` (examples/dra/extended-resources.yaml) lands on a node whose GPUs
only nodeagent publishes; the scheduler makes the pod's ResourceClaim itself and the fake
kubelet has nodeagent's DRA plugin prepare it on the emulated node. In a cluster where one node
runs the device plugin (nvidia.com/gpu in its allocatable) and one DRA, pods asking
nvidia.com/gpu fill both."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from nodeagent.base.errors import KubeError
from nodeagent.dra.k8s.driver import DraDriver
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from tests.k8s.test_gates_real import _plugin
from tests.k8s.test_packing_real import DRIVER, REPO, _device_classes, _publish, _wait
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet, PreparedDevice
from tests.support.k8s import ControlPlane, make_node

PODS = {
    d["metadata"]["name"]: d
    for d in yaml.safe_load_all((REPO / "examples/dra/extended-resources.yaml").read_text())
}
GROUP = "test.nodeagent.io/group"  # the test's nodes: other tests' DRA nodes are no target


def _pod(example: str, name: str, namespace: str, group: str) -> dict[str, Any]:
    """The example pod as it is, but for its name, namespace and the test's nodes (its
    quantities as strings: the client's models take no number)."""
    doc = PODS[example]
    containers = [
        {**c, "resources": {"limits": {k: str(v) for k, v in c["resources"]["limits"].items()}}}
        for c in doc["spec"]["containers"]
    ]
    spec = {**doc["spec"], "containers": containers, "nodeSelector": {GROUP: group}}
    return {**doc, "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _read(api: Any, namespace: str, pod: str) -> dict[str, Any]:
    """The pod as the API server has it (JSON: status.extendedResourceClaimStatus is newer
    than the client's models)."""
    from kubernetes import client

    raw = client.CoreV1Api(api).read_namespaced_pod(pod, namespace, _preload_content=False)
    result: dict[str, Any] = json.loads(raw.data)
    return result


def _claim(api: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    raw = client.ResourceV1Api(api).read_namespaced_resource_claim(
        name, namespace, _preload_content=False
    )
    result: dict[str, Any] = json.loads(raw.data)
    return result


def _bound(api: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    got = _read(api, namespace, pod)
    return got if got["spec"].get("nodeName") else None


@contextmanager
def _dra_node(
    root: Path, cp: ControlPlane, api: Any, group: str
) -> Iterator[tuple[str, DraDriver, NvmlSession, FakeDraKubelet]]:
    """A node with one emulated H200 (MIG on, no slice) and no device plugin: nodeagent's DRA
    plugin publishes its devices and serves the fake kubelet."""
    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(api, node, {GROUP: group})
    plugin, session = _plugin(root, cp, node, "h200")
    MigWriter(session).set_mig_mode(0, True)  # a whole GPU's claim turns it off again
    plugin.start()
    stop = threading.Event()

    def bind() -> None:
        """The agent's dra-bind worker: a MIG placement not made yet has binding conditions;
        a pass that fails (KubeError: the watch ended at once, as the teardown's interrupt
        ends it) is tried again, as the worker tries it."""
        while not stop.wait(0.5):
            with contextlib.suppress(KubeError):
                plugin.bind()

    binder = threading.Thread(target=bind)
    binder.start()
    try:
        assert plugin.publish(read_inventory(session))
        kubelet = FakeDraKubelet(root / "reg")
        kubelet.register(DRIVER)
        _device_classes(api)
        yield node, plugin, session, kubelet
    finally:
        stop.set()
        while binder.is_alive():  # its watch ends now (the agent's stop does the same)
            plugin.api.interrupt()
            binder.join(0.5)
        plugin.stop()
        session.close()


def _scheduled_claim(api: Any, namespace: str, pod: str, node: str) -> dict[str, Any]:
    """The ResourceClaim the scheduler made for the pod's extended resources, once the pod is
    bound to `node`; checks what the scheduler wrote on both."""
    got = _wait(f"pod {pod} bound", lambda: _bound(api, namespace, pod))
    assert got["spec"]["nodeName"] == node
    status = got["status"]["extendedResourceClaimStatus"]
    claim = _claim(api, namespace, status["resourceClaimName"])
    meta = claim["metadata"]
    prefix = f"{pod}-extended-resources-"  # metadata.generateName: 5 random characters follow
    assert meta["name"].startswith(prefix) and len(meta["name"]) == len(prefix) + 5
    assert meta["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", pod, got["metadata"]["uid"])
    assert owner["controller"] is True
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": pod, "uid": got["metadata"]["uid"]}
    ]
    (container,) = got["spec"]["containers"]
    (resource,) = container["resources"]["limits"]
    assert status["requestMappings"] == [
        {"containerName": "main", "resourceName": resource, "requestName": "container-0-request-0"}
    ]
    return claim


def test_an_unchanged_pod_asking_nvidia_com_gpu_gets_a_whole_gpu_from_dra(
    api_client: Any, control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    from kubernetes import client

    group = uuid.uuid4().hex[:8]
    with _dra_node(short_tmp, control_plane, api_client, group) as (node, _, session, kubelet):
        pod = _pod("cuda-job", "cuda-job", namespace, group)
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod)
        claim = _scheduled_claim(api_client, namespace, "cuda-job", node)
        assert claim["spec"]["devices"]["requests"] == [
            {
                "name": "container-0-request-0",
                "exactly": {
                    "deviceClassName": "gpu.nodeagent.io",
                    "allocationMode": "ExactCount",
                    "count": 1,
                },
            }
        ]
        assert claim["status"]["allocation"]["devices"]["results"] == [
            {"request": "container-0-request-0", "driver": DRIVER, "pool": node, "device": "gpu-0"}
        ]

        ref = Claim(namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
        result = kubelet.prepare([ref])[ref.uid]
        assert result.error == ""
        uid = claim["metadata"]["uid"]
        assert result.devices == (
            PreparedDevice(
                ("container-0-request-0",), node, "gpu-0", (f"k8s.{DRIVER}/claim={uid}-gpu-0",)
            ),
        )
        gpu = read_inventory(session).gpus[0]
        assert not gpu.mig_current  # the whole GPU, MIG turned off for it
        spec = next((short_tmp / "cdi").glob(f"*{uid}*"))
        assert gpu.uuid in spec.read_text()
        assert kubelet.unprepare([ref]) == {ref.uid: ""}
        assert list((short_tmp / "cdi").glob(f"*{uid}*")) == []


def test_an_unchanged_pod_asking_a_mig_profile_gets_that_slice_made(
    api_client: Any, control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    from kubernetes import client

    group = uuid.uuid4().hex[:8]
    with _dra_node(short_tmp, control_plane, api_client, group) as (node, _, session, kubelet):
        pod = _pod("asr-small", "asr-small", namespace, group)
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, pod)
        claim = _scheduled_claim(api_client, namespace, "asr-small", node)
        (request,) = claim["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == "mig-1g.18gb.gpu.nodeagent.io"
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        # the first fit: nodeagent publishes a profile's placements from the highest start
        assert result["device"] == "gpu-0-mig-1g18gb-19-6"

        ref = Claim(namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
        prepared = kubelet.prepare([ref])[ref.uid]
        assert prepared.error == ""
        assert [(d.requests, d.device) for d in prepared.devices] == [
            (("container-0-request-0",), "gpu-0-mig-1g18gb-19-6")
        ]
        slices = read_inventory(session).gpus[0].slices
        assert [(s.profile, s.placement.start) for s in slices] == [("1g.18gb", 6)]
        assert kubelet.unprepare([ref]) == {ref.uid: ""}
        assert read_inventory(session).gpus[0].slices == ()


def test_device_plugin_and_dra_nodes_both_serve_nvidia_com_gpu(
    api_client: Any, namespace: str
) -> None:
    """One node advertises nvidia.com/gpu: 1 in its allocatable (the device plugin's, no
    ResourceSlice), one has an H200 only nodeagent's ResourceSlices publish: two pods asking
    nvidia.com/gpu fill both, a third waits. Only the DRA node's pod gets a ResourceClaim."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    group = uuid.uuid4().hex[:8]
    plugin_node, dra_node = f"n-{uuid.uuid4().hex[:8]}", f"n-{uuid.uuid4().hex[:8]}"
    make_node(api_client, plugin_node, {GROUP: group})
    gpus = {"nvidia.com/gpu": "1"}
    core.patch_node_status(plugin_node, {"status": {"capacity": gpus, "allocatable": gpus}})
    make_node(api_client, dra_node, {GROUP: group})
    _publish(api_client, dra_node, "h200")
    _device_classes(api_client)

    nodes = {}
    for name in ("job-0", "job-1"):
        core.create_namespaced_pod(namespace, _pod("cuda-job", name, namespace, group))
        bound = _wait(f"pod {name} bound", lambda n=name: _bound(api_client, namespace, n))
        nodes[name] = bound["spec"]["nodeName"]
    assert sorted(nodes.values()) == sorted([plugin_node, dra_node])
    (on_dra,) = [p for p, n in nodes.items() if n == dra_node]
    (on_plugin,) = [p for p, n in nodes.items() if n == plugin_node]
    claim = _scheduled_claim(api_client, namespace, on_dra, dra_node)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0"
    assert "extendedResourceClaimStatus" not in _read(api_client, namespace, on_plugin)["status"]
    claims = client.ResourceV1Api(api_client).list_namespaced_resource_claim(namespace).items
    assert [c.metadata.name for c in claims] == [claim["metadata"]["name"]]

    core.create_namespaced_pod(namespace, _pod("cuda-job", "job-2", namespace, group))

    def unschedulable() -> dict[str, Any] | None:
        got = _read(api_client, namespace, "job-2")
        conditions = got["status"].get("conditions", [])
        refused = any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
        return got if refused else None

    waiting = _wait("pod job-2 found no node", unschedulable)  # both nodes are full
    assert not waiting["spec"].get("nodeName")
