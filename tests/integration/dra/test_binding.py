"""The binding watcher (nodeagent.dra.k8s.binding) against kmock's API server and the emulator: a
claim whose device carries binding conditions gets its slice made before the kubelet's prepare
and SliceReady True in its status; the prepare adopts the slice. The edges: the claim deleted
meanwhile, the API server down or refusing the status write, a placement another claim holds."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.dra.checkpoint import PREPARED, PREPARING, load
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.binding import Binder
from nodeagent.kube.api import KubeSettings, make_api_client
from tests.support.dra import CLAIMS, DRIVER, DraNode, allocated_claim, kmock

READY = f"{DRIVER}/SliceReady"
FAILED = f"{DRIVER}/SliceFailed"
DEVICE = "gpu-0-mig-1g18gb-19-6"


def _waited_on(name: str, uid: str, device: str = DEVICE) -> dict[str, Any]:
    """A claim as the scheduler leaves it in PreBind: the device's binding conditions copied
    into its allocation result."""
    claim = allocated_claim(name, uid, {"s": device})
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    result["bindingConditions"] = [READY]
    result["bindingFailureConditions"] = [FAILED]
    return claim


def _binder(dra_node: DraNode) -> Binder:
    reports = dra_node.server.v1.reports
    return Binder(reports.api, dra_node.node, reports)


def _conditions(dra_node: DraNode, name: str) -> dict[str, tuple[str, str]]:
    """The claim's device conditions ({} while its status has none yet: a wait polls on)."""
    entries = dra_node.claim("speech", name)["status"].get("devices") or [{"conditions": []}]
    (entry,) = entries
    return {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}


def _owned(dra_node: DraNode) -> set[str]:
    return set(dra_node.node.owners.read().claims)


def test_the_slice_is_made_before_the_prepare_which_adopts_it(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(_waited_on("asr", "uid-a"))
    binder = _binder(dra_node)
    binder.cycle()
    assert dra_node.layout() == [("1g.18gb", 6)]
    assert _conditions(dra_node, "asr") == {READY: ("True", "SliceMade")}
    (entry,) = dra_node.claim("speech", "asr")["status"]["devices"]
    (made,) = dra_node.inventory().gpus[0].slices
    assert entry["data"]["uuid"] == made.mig_uuid and entry["data"]["mig"]["created"] is True
    assert load(dra_node.checkpoint).claims["uid-a"].state == PREPARING
    assert _owned(dra_node) == {"uid-a"}  # the record and the checkpoint agree

    stored = dra_node.claim("speech", "asr")
    binder.cycle()  # settled: nothing made, nothing written
    assert dra_node.claim("speech", "asr") == stored and dra_node.layout() == [("1g.18gb", 6)]

    answer = dra_node.kubelet.prepare([claim])["uid-a"]
    assert answer.error == "" and [d.device for d in answer.devices] == [DEVICE]
    (adopted,) = dra_node.inventory().gpus[0].slices
    assert adopted.mig_uuid == made.mig_uuid
    assert load(dra_node.checkpoint).claims["uid-a"].state == PREPARED
    assert dra_node.kubelet.unprepare([claim]) == {"uid-a": ""}
    assert dra_node.layout() == [] and _owned(dra_node) == set()


def test_a_claim_deleted_before_its_prepare_gives_its_slice_back(dra_node: DraNode) -> None:
    dra_node.add_claim(_waited_on("asr", "uid-a"))
    binder = _binder(dra_node)
    binder.cycle()
    assert dra_node.layout() == [("1g.18gb", 6)]
    del dra_node.cluster.km.objects[CLAIMS, "speech", "asr"]
    binder.cycle()
    assert dra_node.layout() == []
    assert load(dra_node.checkpoint).claims == {} and _owned(dra_node) == set()


def test_a_claim_without_binding_conditions_is_left_to_its_prepare(dra_node: DraNode) -> None:
    dra_node.add_claim(allocated_claim("asr", "uid-a", {"s": DEVICE}))
    _binder(dra_node).cycle()
    assert dra_node.layout() == [] and load(dra_node.checkpoint).claims == {}
    assert not dra_node.claim("speech", "asr")["status"].get("devices")


def test_a_placement_another_claim_holds_sets_the_failure_condition(dra_node: DraNode) -> None:
    first = dra_node.add_claim(allocated_claim("one", "uid-1", {"s": "gpu-0-mig-1g35gb-20-6"}))
    assert dra_node.kubelet.prepare([first])["uid-1"].error == ""
    before = dra_node.layout()
    assert [start for _, start in before] == [6]
    dra_node.add_claim(_waited_on("two", "uid-2"))
    _binder(dra_node).cycle()
    assert _conditions(dra_node, "two") == {FAILED: ("True", "SliceCreateFailed")}
    (entry,) = dra_node.claim("speech", "two")["status"]["devices"]
    (condition,) = entry["conditions"]
    assert "claim speech/one" in condition["message"], condition
    assert dra_node.layout() == before  # nothing changed
    assert "uid-2" not in load(dra_node.checkpoint).claims and _owned(dra_node) == {"uid-1"}


def test_an_api_server_down_makes_nothing(dra_node: DraNode) -> None:
    dra_node.add_claim(_waited_on("asr", "uid-a"))
    kube = KubeSettings(node_name="node-1", host="http://127.0.0.1:9", retry_seconds=0.2)
    down = Binder(DraApi(make_api_client(kube), kube), dra_node.node, dra_node.server.v1.reports)
    with pytest.raises(KubeError):
        down.cycle()
    assert dra_node.layout() == [] and load(dra_node.checkpoint).claims == {}


def test_a_refused_status_write_is_written_at_the_next_cycle_without_a_second_make(
    dra_node: DraNode,
) -> None:
    dra_node.add_claim(_waited_on("asr", "uid-a"))
    binder = _binder(dra_node)
    failure = kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="etcd down")
    dra_node.cluster.status_fault = lambda: failure
    binder.cycle()
    (made,) = dra_node.inventory().gpus[0].slices
    dra_node.cluster.status_fault = None
    binder.cycle()
    assert _conditions(dra_node, "asr") == {READY: ("True", "SliceMade")}
    (again,) = dra_node.inventory().gpus[0].slices
    assert again.mig_uuid == made.mig_uuid


def test_the_worker_lists_once_then_binds_what_the_watch_brings(dra_node: DraNode) -> None:
    """`run`, the dra-bind worker's pass: a list when there is none to watch from, then the
    claims' changes as they come (a claim added while it watches is bound in that watch; one
    deleted is released), not a list of every claim each second."""
    import json
    import threading
    import urllib.request

    kube = KubeSettings(node_name="node-1", host=dra_node.cluster.url, watch_timeout_seconds=3)
    binder = Binder(DraApi(make_api_client(kube), kube), dra_node.node, dra_node.server.v1.reports)
    collection = f"{dra_node.cluster.url}/apis/resource.k8s.io/v1/namespaces/speech/resourceclaims"

    def send(method: str, url: str, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        urllib.request.urlopen(request, timeout=10).close()

    worker = threading.Thread(target=binder.run)
    worker.start()
    try:
        dra_node.cluster.wait(lambda: binder.version is not None, what="the first list")
        send("POST", collection, _waited_on("asr", "uid-w"))
        dra_node.cluster.wait(lambda: dra_node.layout() == [("1g.18gb", 6)], what="the slice")
        dra_node.cluster.wait(
            lambda: _conditions(dra_node, "asr") == {READY: ("True", "SliceMade")},
            what="SliceReady",
        )
        send("DELETE", f"{collection}/asr")
        dra_node.cluster.wait(lambda: dra_node.layout() == [], what="the slice given back")
    finally:
        binder.api.interrupt()
        worker.join(10)
    lists = [
        r for r in list(dra_node.cluster.km)
        if "resourceclaims" in str(r.url) and "watch" not in str(r.url) and r.method == "GET"
    ]  # fmt: skip
    assert len(lists) == 1  # one list; the rest came over the watch


def test_an_event_of_before_the_ready_write_makes_nothing_after_the_unprepare(
    dra_node: DraNode,
) -> None:
    """Under load the watch can bring the claim as the scheduler allocated it (unsettled) after
    the binder said it ready, the kubelet prepared it and unprepared it: the binder made its
    slices once and does not make them again (found on the real scheduler: a slice left)."""
    claim = dra_node.add_claim(_waited_on("asr", "uid-a"))
    before = dra_node.claim("speech", "asr")  # as the scheduler left it: not yet settled
    binder = _binder(dra_node)
    binder.cycle()
    assert dra_node.layout() == [("1g.18gb", 6)]
    assert dra_node.kubelet.prepare([claim])["uid-a"].error == ""
    assert dra_node.kubelet.unprepare([claim]) == {"uid-a": ""}
    assert dra_node.layout() == []
    binder.changed("MODIFIED", before)  # the event of before, late
    assert dra_node.layout() == [] and _owned(dra_node) == set()
    # Deallocated, then allocated here again: a binding of its own.
    gone = {**before, "status": {}}
    binder.changed("MODIFIED", gone)
    binder.changed("MODIFIED", before)
    assert dra_node.layout() == [("1g.18gb", 6)]
