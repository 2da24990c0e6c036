"""Binding conditions (KEP-5007, DRADeviceBindingConditions) against the real kube-scheduler
v1.36.2: a pod whose claim gets a MIG placement not made yet stays unbound (the scheduler
waits in PreBind) until nodeagent's binding watcher has made the slice and set
gpu.nodeagent.io/SliceReady; the kubelet's prepare then adopts that slice. A make that the
emulator refuses sets gpu.nodeagent.io/SliceFailed: the scheduler fails the binding and
deallocates the claim (it is then allocated again, here on the one node there is)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pynvml

from nodeagent.base.files import interrupted_writes
from nodeagent.dra.checkpoint import PREPARED, load
from nodeagent.nvml import MigWriter, read_inventory
from nodeagent.sim.faults import Fault, FaultPlan
from tests.k8s.test_dra_real import _template
from tests.k8s.test_gates_real import _plugin
from tests.k8s.test_packing_real import DRIVER, _device_classes, _pod, _wait
from tests.support.crash import run
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet
from tests.support.k8s import ControlPlane, make_node

READY = f"{DRIVER}/SliceReady"
FAILED = f"{DRIVER}/SliceFailed"


def _claim_of(api: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    from kubernetes import client

    raw = client.ResourceV1Api(api).list_namespaced_resource_claim(
        namespace, _preload_content=False
    )
    for c in json.loads(raw.data)["items"]:
        if c["metadata"]["name"].startswith(f"{pod}-g-"):
            return dict(c)
    return None


def _allocated(api: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    c = _claim_of(api, namespace, pod)
    return c if c and (c.get("status") or {}).get("allocation") else None


def _node_of(api: Any, namespace: str, pod: str) -> str | None:
    from kubernetes import client

    got = client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
    return str(got.spec.node_name) if got.spec.node_name else None


def _scheduling_failures(api: Any, namespace: str) -> list[str]:
    from kubernetes import client

    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [str(e.message) for e in events if e.reason == "FailedScheduling"]


def _conditions(claim: dict[str, Any]) -> dict[str, str]:
    (entry,) = [e for e in claim["status"].get("devices") or [] if e["driver"] == DRIVER]
    return {c["type"]: c["status"] for c in entry["conditions"]}


def _setup(short_tmp: Path, cp: ControlPlane, api: Any, namespace: str) -> tuple[str, Any, Any]:
    from kubernetes import client

    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(api, node)
    plugin, session = _plugin(short_tmp, cp, node, "h200")
    MigWriter(session).set_mig_mode(0, True)
    plugin.start()
    assert plugin.publish(read_inventory(session))
    _device_classes(api)
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        namespace, _template("one-1g-slice", namespace)
    )
    client.CoreV1Api(api).create_namespaced_pod(
        namespace, _pod("asr", node, {"resourceClaimTemplateName": "one-1g-slice"})
    )
    return node, plugin, session


def test_the_pod_binds_once_the_watcher_made_its_slice_and_prepare_adopts_it(
    api_client: Any, control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    node, plugin, session = _setup(short_tmp, control_plane, api_client, namespace)
    try:
        claim = _wait("the claim allocated", lambda: _allocated(api_client, namespace, "asr"))
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [READY]
        assert result["bindingFailureConditions"] == [FAILED]
        time.sleep(6)  # the scheduler reads the claim every 5 s in PreBind: it still waits
        assert _node_of(api_client, namespace, "asr") is None
        assert read_inventory(session).gpus[0].slices == ()

        plugin.binder.cycle()  # one pass of the dra-bind worker: the list
        (made,) = read_inventory(session).gpus[0].slices
        assert made.placement.start == int(result["device"].rsplit("-", 1)[1])
        now = _claim_of(api_client, namespace, "asr")
        assert now is not None and _conditions(now) == {READY: "True"}
        assert _wait("the pod bound", lambda: _node_of(api_client, namespace, "asr"), 30) == node

        kubelet = FakeDraKubelet(short_tmp / "reg")
        kubelet.register(DRIVER)
        meta = now["metadata"]
        ref = Claim(meta["namespace"], meta["name"], meta["uid"])
        answer = kubelet.prepare([ref])[ref.uid]
        assert answer.error == "" and [d.device for d in answer.devices] == [result["device"]]
        (adopted,) = read_inventory(session).gpus[0].slices  # no second slice made
        assert adopted.mig_uuid == made.mig_uuid
        assert load(plugin.checkpoint).claims[ref.uid].state == PREPARED
        assert kubelet.unprepare([ref]) == {ref.uid: ""}
        assert read_inventory(session).gpus[0].slices == ()  # the claim made it: it goes
    finally:
        plugin.stop()
        session.close()


def test_a_prepare_killed_writing_its_cdi_spec_leaves_nothing_once_its_pod_is_deleted(
    api_client: Any, control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    """Issue 39 class 7 on the real scheduler: the slice made before the pod bound, the agent
    down, the kubelet's prepare killed between the CDI spec's temporary file and its rename,
    then the pod deleted (its claim with it). The restarted agent's binding watcher undoes the
    claim it holds as preparing, the kubelet's unprepare finds nothing more to do, and nothing
    is left: no file in the CDI folder, no slice, no checkpoint or ownership entry."""
    from kubernetes import client

    node, plugin, session = _setup(short_tmp, control_plane, api_client, namespace)
    try:
        _wait("the claim allocated", lambda: _allocated(api_client, namespace, "asr"))
        plugin.binder.cycle()  # the slice made, SliceReady
        assert _wait("the pod bound", lambda: _node_of(api_client, namespace, "asr"), 30) == node
        claim = _claim_of(api_client, namespace, "asr")
        assert claim is not None
    finally:
        plugin.stop()  # the agent goes down
        session.close()
    meta = claim["metadata"]
    spec = short_tmp / "cdi" / f"k8s.{DRIVER}-claim_{meta['uid']}.json"
    killed = run(short_tmp, "prepare", claim, None, {"at": str(spec)}, pool=node, gpus="h200")
    assert killed == 137
    assert not spec.exists() and len(interrupted_writes(spec)) == 1
    client.CoreV1Api(api_client).delete_namespaced_pod("asr", namespace, grace_period_seconds=0)
    _wait("the claim deleted", lambda: _claim_of(api_client, namespace, "asr") is None, 60)

    plugin, session = _plugin(short_tmp, control_plane, node, "h200")  # the agent restarted
    plugin.start()
    try:
        plugin.binder.cycle()  # the list: the claim it holds as preparing is gone, undone
        kubelet = FakeDraKubelet(short_tmp / "reg")
        kubelet.register(DRIVER)
        ref = Claim(meta["namespace"], meta["name"], meta["uid"])
        assert kubelet.unprepare([ref]) == {ref.uid: ""}
        assert os.listdir(short_tmp / "cdi") == []
        assert read_inventory(session).gpus[0].slices == ()
        assert load(plugin.checkpoint).claims == {}
        assert plugin.node.owners.read().claims == {}
    finally:
        plugin.stop()
        session.close()


def test_a_refused_make_sets_the_failure_condition_and_the_pod_does_not_bind(
    api_client: Any, control_plane: ControlPlane, namespace: str, short_tmp: Path
) -> None:
    _, plugin, session = _setup(short_tmp, control_plane, api_client, namespace)
    session.lib.faults = FaultPlan(
        [
            Fault(
                function="nvmlDeviceCreateGpuInstanceWithPlacement", error=pynvml.NVML_ERROR_UNKNOWN
            )
        ]
    )
    try:
        claim = _wait("the claim allocated", lambda: _allocated(api_client, namespace, "asr"))
        began = time.monotonic()
        plugin.binder.cycle()  # one pass of the dra-bind worker: the list
        now = _claim_of(api_client, namespace, "asr")
        assert now is not None and _conditions(now) == {FAILED: "True"}
        assert read_inventory(session).gpus[0].slices == ()  # nothing made, nothing held
        assert claim["metadata"]["uid"] not in load(plugin.checkpoint).claims

        def said(text: str) -> bool:
            return any(text in m for m in _scheduling_failures(api_client, namespace))

        # The scheduler's next read in PreBind (every 5 s) fails the binding with our reason;
        # its next cycle's PostFilter deallocates the claim so that it can be allocated again.
        _wait("the binding failed", lambda: said("reason=SliceCreateFailed"), 30)
        _wait("the claim deallocated", lambda: said("deallocation of ResourceClaim completed"), 30)
        assert time.monotonic() - began < 30
        assert _node_of(api_client, namespace, "asr") is None
    finally:
        plugin.stop()
        session.close()
