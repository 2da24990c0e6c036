"""The claim's status.devices (resource.k8s.io/v1 AllocatedDeviceStatus): after a prepare the
driver reports what it made, Ready True (Ready False with the error when the prepare failed),
and removes its entries at unprepare; a write that fails is a report that failed, never a
prepare that failed, and it is said once and counted."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from nodeagent.dra.k8s import reports
from nodeagent.dra.k8s import server as dra_server
from tests.support.cli import captured_logs
from tests.support.dra import DRIVER, NODE, DraNode, allocated_claim, kmock, mps_config
from tests.support.fake_kubelet.dra import Claim


def _entries(dra_node: DraNode, name: str) -> dict[str, dict[str, Any]]:
    devices = (dra_node.claim("speech", name).get("status") or {}).get("devices") or []
    return {e["device"]: e for e in devices}


def _ready(entry: dict[str, Any]) -> dict[str, Any]:
    (condition,) = entry["conditions"]
    assert condition["type"] == "Ready"
    return dict(condition)


def _writes(dra_node: DraNode, result: str) -> int:
    assert dra_node.stats is not None
    return dra_node.stats.status_writes.get(result, 0)


def test_a_prepare_reports_what_it_made_and_an_unprepare_removes_it(dra_node: DraNode) -> None:
    mig = dra_node.add_claim(allocated_claim("asr", "uid-m", {"s": "gpu-0-mig-1g18gb-19-3"}))
    whole = dra_node.add_claim(allocated_claim("llm", "uid-w", {"g": "gpu-1"}))
    answers = dra_node.kubelet.prepare([mig, whole])
    assert all(a.error == "" for a in answers.values())

    (made,) = [s for s in dra_node.inventory().gpus[0].slices if s.placement.start == 3]
    entry = _entries(dra_node, "asr")["gpu-0-mig-1g18gb-19-3"]
    assert (entry["driver"], entry["pool"]) == (DRIVER, NODE)
    gpu0 = dra_node.inventory().gpus[0].uuid
    assert entry["data"] == {
        "apiVersion": "gpu.nodeagent.io/v1",
        "kind": "DeviceStatus",
        "type": "mig",
        "uuid": made.mig_uuid,
        "gpu": {"index": 0, "uuid": gpu0},
        "mig": {
            "profile": "1g.18gb",
            "profileId": 19,
            "placement": {"start": 3, "size": 1},
            "created": True,
        },
    }
    ready = _ready(entry)
    assert (ready["status"], ready["reason"]) == ("True", "Prepared")
    assert str(made.mig_uuid) in ready["message"] and ready["lastTransitionTime"].endswith("Z")
    (gpu,) = _entries(dra_node, "llm").values()
    gpu1 = dra_node.inventory().gpus[1].uuid
    assert gpu["data"]["type"] == "gpu" and gpu["data"]["uuid"] == gpu1
    assert _ready(gpu)["status"] == "True"
    assert _writes(dra_node, "success") == 2

    # The kubelet asks again (a restart): the claim says so already, nothing is written.
    assert dra_node.kubelet.prepare([whole])["uid-w"].error == ""
    assert _writes(dra_node, "success") == 2

    assert dra_node.kubelet.unprepare([mig, whole]) == {"uid-m": "", "uid-w": ""}
    assert _entries(dra_node, "asr") == {} and _entries(dra_node, "llm") == {}


def test_an_mps_share_reports_its_limits(dra_node: DraNode) -> None:
    share = dra_node.add_claim(
        allocated_claim("tts", "uid-s", {"g": "gpu-1"}, mps_config(25, "16Gi"))
    )
    assert dra_node.kubelet.prepare([share])["uid-s"].error == ""
    (entry,) = _entries(dra_node, "tts").values()
    assert entry["data"]["type"] == "mps"
    assert entry["data"]["mps"] == {"threadPercentage": 25, "pinnedMemoryBytes": 16 << 30}
    assert entry["data"]["uuid"] == dra_node.inventory().gpus[1].uuid
    assert "25 % of its SMs, 16384 MiB pinned memory" in _ready(entry)["message"]
    assert dra_node.kubelet.unprepare([share]) == {"uid-s": ""}
    assert _entries(dra_node, "tts") == {}


def test_a_failed_prepare_says_why_in_the_ready_condition(dra_node: DraNode) -> None:
    bad = dra_node.add_claim(
        allocated_claim("x", "uid-x", {"g": "gpu-0-mig-1g18gb-19-0"}, mps_config(50))
    )
    error = dra_node.kubelet.prepare([bad])["uid-x"].error
    assert "an MPS share needs a whole GPU" in error
    (entry,) = _entries(dra_node, "x").values()
    ready = _ready(entry)
    assert (ready["status"], ready["reason"]) == ("False", "PrepareFailed")
    assert "an MPS share needs a whole GPU" in ready["message"] and "data" not in entry
    assert dra_node.kubelet.unprepare([bad]) == {"uid-x": ""}
    assert _entries(dra_node, "x") == {}


def _prepare_timed(dra_node: DraNode, name: str, uid: str, device: str) -> tuple[str, float, Claim]:
    """A claim of `device` prepared through the kubelet: its error, how long it took, itself."""
    claim = dra_node.add_claim(allocated_claim(name, uid, {"g": device}))
    began = time.monotonic()
    error = dra_node.kubelet.prepare([claim])[uid].error
    return error, time.monotonic() - began, claim


@pytest.fixture
def short_deadline(dra_node: DraNode, monkeypatch: pytest.MonkeyPatch) -> float:
    """The kubelet's deadline here: 5 s (a real kubelet gives 45 s), so 2 s to answer."""
    monkeypatch.setattr(dra_server, "KUBELET_CALL_SECONDS", 5.0)
    dra_node.kubelet.timeout_seconds = 5.0
    return 5.0


def test_an_api_server_failing_the_write_fails_the_report_not_the_prepare(
    dra_node: DraNode, short_deadline: float
) -> None:
    failure = kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="etcd down")
    dra_node.cluster.status_fault = lambda: failure
    with captured_logs("warning") as logs:
        first = _prepare_timed(dra_node, "a", "uid-a", "gpu-0-mig-1g18gb-19-0")
        second = _prepare_timed(dra_node, "b", "uid-b", "gpu-0-mig-1g18gb-19-1")
    for error, took, _ in (first, second):
        assert error == "" and took < short_deadline, (error, took)
    assert [p.start for p in [s.placement for s in dra_node.inventory().gpus[0].slices]] == [0, 1]
    # (kmock stores a write even when a reaction answers it with an error: not asserted here)
    assert _writes(dra_node, "failure") == 2 and _writes(dra_node, "success") == 0
    said = [e for e in logs if e["event"] == "dra.status_write_failed"]
    assert len(said) == 1 and "HTTP 503" in said[0]["error"], said  # once, not per claim
    assert not [e for e in logs if e["event"] == "kube.retry"]  # nor per retry

    dra_node.cluster.status_fault = None  # the API server is back: the next write works
    with captured_logs("info") as logs:
        assert _prepare_timed(dra_node, "c", "uid-c", "gpu-1")[0] == ""
    assert _ready(_entries(dra_node, "c")["gpu-1"])["status"] == "True"
    assert [e["event"] for e in logs if e["event"].startswith("dra.status")] == [
        "dra.status_write_restored"
    ]


def test_an_api_server_that_hangs_on_the_write_leaves_each_call_in_time(
    dra_node: DraNode, short_deadline: float
) -> None:
    import asyncio

    error, _, kept = _prepare_timed(dra_node, "k", "uid-k", "gpu-1")
    assert error == "" and _entries(dra_node, "k")
    dra_node.cluster.status_fault = lambda: asyncio.sleep(30)  # answers nothing
    error, took, _ = _prepare_timed(dra_node, "a", "uid-a", "gpu-0-mig-1g18gb-19-0")
    assert error == "" and took < short_deadline, (error, took)
    assert _writes(dra_node, "failure") == 1
    # an unprepare's removal waits at most its own second
    began = time.monotonic()
    assert dra_node.kubelet.unprepare([kept]) == {"uid-k": ""}
    assert time.monotonic() - began < reports.CLEAR_SECONDS + 1.0
    assert _writes(dra_node, "failure") == 2
    assert "uid-k" not in json.loads(dra_node.checkpoint.read_text())["claims"]  # unprepared


def test_no_time_left_before_the_deadline_is_no_write(
    dra_node: DraNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prepare that used the kubelet's whole deadline answers at once: the report is
    skipped (and counted as failed), never written late."""
    monkeypatch.setattr(reports, "MIN_SECONDS", 3600.0)
    error, _, _ = _prepare_timed(dra_node, "a", "uid-a", "gpu-1")
    assert error == "" and _entries(dra_node, "a") == {}
    assert _writes(dra_node, "failure") == 1
    assert dra_node.cluster.writes("/resourceclaims/") == 0  # not even tried
