"""The kubelet-facing edge survives faults: every claim of a call gets its own answer (a
malformed, refused or crashing one never fails the others), names and UIDs are checked before
they touch a path, a prepare answers before the kubelet's deadline when the API server is down
while an unprepare answers at once, one agent owns a plugin directory, and an unreadable
checkpoint makes /readyz say why."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nodeagent.base.errors import LockHeld
from nodeagent.dra.k8s import server as dra_server
from nodeagent.dra.k8s.server import KubeletPluginServer, Sockets
from tests.support.dra import DRIVER, DraNode, allocated_claim
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet


def test_a_malformed_claim_never_fails_the_good_one_beside_it(dra_node: DraNode) -> None:
    good = dra_node.add_claim(allocated_claim("asr", "uid-good", {"g": "gpu-0-mig-1g18gb-19-0"}))
    bad = [
        Claim("speech", "x", "../../etc"),
        Claim("speech", "x", "u" * 300),
        Claim("Bad_NS", "x", "uid-3"),
        Claim("speech", "x\u202e" + "y" * 500, "uid-4"),
        Claim("speech", "x", ""),
    ]
    answers = dra_node.kubelet.prepare([*bad, good, good])
    assert answers["uid-good"].error == "" and answers["uid-good"].devices
    assert dra_node.layout(0) == [("1g.18gb", 0)]
    for claim in bad:
        error = answers[claim.uid].error
        assert "is not a valid Kubernetes" in error and len(error) < 300, error
    # nothing was made for them anywhere
    made = {p.name for p in dra_node.root.rglob("*")}
    assert not any("etc" in name or "uuuu" in name for name in made)
    # unprepare answers per claim as well
    gone = dra_node.kubelet.unprepare([bad[0], good])
    assert gone["uid-good"] == "" and "is not a valid Kubernetes UID" in gone["../../etc"]


def test_a_crashing_claim_is_that_claims_answer(
    dra_node: DraNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = dra_node.add_claim(allocated_claim("a", "uid-a", {"g": "gpu-1"}))
    b = dra_node.add_claim(allocated_claim("b", "uid-b", {"g": "gpu-0-mig-1g18gb-19-0"}))
    real = dra_node.node.prepare

    def prepare(ref, claim, deadline=None, ticket=None):  # type: ignore[no-untyped-def]
        if ref.uid == "uid-a":
            raise KeyError("a bug")
        return real(ref, claim, deadline, ticket)

    monkeypatch.setattr(dra_node.node, "prepare", prepare)
    answers = dra_node.kubelet.prepare([a, b])
    assert answers["uid-a"].error.startswith("claim speech/a: internal error (KeyError")
    assert answers["uid-b"].error == ""


def test_the_api_server_down_prepare_answers_in_time_unprepare_at_once(
    dra_node: DraNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = dra_node.add_claim(allocated_claim("llm", "uid-w", {"g": "gpu-1"}))
    assert dra_node.kubelet.prepare([whole])["uid-w"].error == ""
    dra_node.cluster.close()  # the API server goes away
    # The kubelet's deadline here: 5 s (a real kubelet gives 45 s).
    monkeypatch.setattr(dra_server, "KUBELET_CALL_SECONDS", 5.0)
    dra_node.kubelet.timeout_seconds = 5.0
    late = Claim("speech", "late", "uid-l")
    results: dict[str, object] = {}

    def prepare() -> None:
        results["prepare"] = dra_node.kubelet.prepare([late])["uid-l"].error

    began = time.monotonic()
    thread = threading.Thread(target=prepare)
    thread.start()
    time.sleep(0.2)  # the prepare is waiting for the API server
    assert dra_node.kubelet.unprepare([whole]) == {"uid-w": ""}
    unprepared = time.monotonic() - began
    thread.join(10)
    took = time.monotonic() - began
    assert "read resourceclaim speech/late failed" in str(results["prepare"])
    assert took < 5.0, took  # answered before the kubelet's deadline
    assert unprepared < 2.0, unprepared  # never queued behind the prepare


def test_one_agent_per_plugin_dir(dra_node: DraNode) -> None:
    sockets = dra_node.server.sockets
    second = KubeletPluginServer(dra_node.node, dra_node.server.v1.api, DRIVER, sockets)
    with pytest.raises(LockHeld, match=r"another nodeagent \(pid \d+\) serves the DRA plugin"):
        second.start()
    assert sockets.plugin.exists() and sockets.registration.exists()
    assert FakeDraKubelet(dra_node.root / "reg").register(DRIVER) == "v1.DRAPlugin"
    # The first stops; the second takes over; the first stopping again leaves it serving.
    dra_node.server.stop()
    second.start()
    try:
        dra_node.server.stop()
        assert sockets.plugin.exists() and sockets.registration.exists()
        assert FakeDraKubelet(dra_node.root / "reg").register(DRIVER) == "v1.DRAPlugin"
    finally:
        second.stop()
    assert not sockets.plugin.exists()


def test_a_socket_left_by_a_killed_agent_is_replaced(short_root: Path, dra_node: DraNode) -> None:
    dra_node.server.stop()
    sockets = Sockets(dra_node.server.sockets.plugin, dra_node.server.sockets.registration)
    sockets.plugin.write_text("")  # a killed agent's socket file (its lock died with it)
    server = KubeletPluginServer(dra_node.node, dra_node.server.v1.api, DRIVER, sockets)
    server.start()
    try:
        assert FakeDraKubelet(dra_node.root / "reg").register(DRIVER) == "v1.DRAPlugin"
    finally:
        server.stop()


def test_a_cdi_spec_that_cannot_be_removed_fails_only_its_claim(dra_node: DraNode) -> None:
    a = dra_node.add_claim(allocated_claim("a", "uid-a", {"g": "gpu-1"}))
    b = dra_node.add_claim(allocated_claim("b", "uid-b", {"g": "gpu-0-mig-1g18gb-19-0"}))
    assert all(r.error == "" for r in dra_node.kubelet.prepare([a, b]).values())
    spec = next(dra_node.cdi_dir.glob("*uid-a*"))
    spec.unlink()
    spec.mkdir()  # something the driver cannot remove stands where its spec was
    (spec / "x").write_text("")

    answers = dra_node.kubelet.unprepare([a, b])

    assert answers["uid-b"] == "" and dra_node.layout(0) == []
    assert "cannot remove what claim speech/a left" in answers["uid-a"]
    assert "the kubelet will ask again" in answers["uid-a"]
    # fixed, the kubelet's next call finishes it
    (spec / "x").unlink()
    spec.rmdir()
    assert dra_node.kubelet.unprepare([a]) == {"uid-a": ""}


def test_a_trailing_newline_or_dotdot_in_a_claim_reference_is_refused(dra_node: DraNode) -> None:
    # one UID rule with the ownership record's: a UID the record could not read back (a
    # trailing newline, '..') never prepares, so later claims are not blocked by it
    bad = [
        Claim("speech", "x", "uid-nl\n"),
        Claim("speech", "x", "a..b"),
        Claim("speech\n", "x", "uid-ns"),
        Claim("speech", "x\n", "uid-name"),
    ]
    answers = dra_node.kubelet.prepare(bad)
    for claim in bad:
        error = answers[claim.uid].error
        assert "is not a valid Kubernetes" in error and "\n" not in error, error
    assert not list(dra_node.root.rglob("*uid-nl*")) and not list(dra_node.root.rglob("*a..b*"))
    good = dra_node.add_claim(allocated_claim("asr", "uid-good", {"g": "gpu-0-mig-1g18gb-19-0"}))
    assert dra_node.kubelet.prepare([good])["uid-good"].error == ""
