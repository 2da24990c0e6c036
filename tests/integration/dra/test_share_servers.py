"""MPS shares that really share (issue 38): the share claims on one device are the clients of
ONE MPS control daemon (nodeagent.mps.servers), started by the first, joined by the others,
stopped after the last; each claim's own limits reach its containers through its CDI spec,
and the daemon's limits are the ceiling (the largest share on it). Claims of different users
get separate daemons. A restarted driver adopts the daemon; a crashed one is started again."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from nodeagent.dra import cdi
from nodeagent.dra.node import NodeDriver
from nodeagent.mps.control import MpsControl
from nodeagent.mps.settings import parse_size
from tests.support.dra import DRIVER, DraNode, allocated_claim
from tests.support.fake_kubelet.dra import Claim

kmock = pytest.importorskip("kmock")


def share(name: str, uid: str, device: str, sm: int, memory: str) -> dict[str, Any]:
    claim = allocated_claim(name, uid, {"gpu": device})
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    result["shareID"] = f"share-{uid}"
    result["consumedCapacity"] = {f"{DRIVER}/sm": str(sm), f"{DRIVER}/memory": memory}
    return claim


def capped(claim: dict[str, Any], **params: Any) -> dict[str, Any]:
    """`claim` with an MpsShare config of its own (smLimit, priority, user)."""
    claim["status"]["allocation"]["devices"].setdefault("config", []).append(
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare", **params}}}
    )  # fmt: skip
    return claim


def env_of(node: DraNode, uid: str) -> dict[str, str]:
    spec = json.loads(cdi.spec_file(node.cdi_dir, DRIVER, uid).read_text())
    (device,) = spec["devices"]
    edits = device["containerEdits"]
    pairs = dict(e.split("=", 1) for e in edits["env"])
    (mount,) = edits["mounts"]
    assert mount["hostPath"] == mount["containerPath"] == pairs["CUDA_MPS_PIPE_DIRECTORY"]
    return pairs


def prepared(node: DraNode, *objects: dict[str, Any]) -> list[Claim]:
    """The claims `objects`, added to the API server and prepared by the kubelet: every one
    answered, none with an error."""
    claims = [node.add_claim(o) for o in objects]
    results = node.kubelet.prepare(claims)
    assert {uid: r.error for uid, r in results.items()} == {c.uid: "" for c in claims}
    return claims


def control_of(root: Path, control: str) -> MpsControl:
    """The control program of the share server at `root`."""
    return MpsControl(control, root / "pipe", root / "log")


def daemon_env(pid: int | None) -> list[bytes]:
    """The environment the daemon `pid` was started with, one VAR=value a list item."""
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def defaults(root: Path, control: str) -> tuple[float, int | None]:
    mps = control_of(root, control)
    text = mps.command("get_default_device_pinned_mem_limit 0")
    return float(mps.command("get_default_active_thread_percentage")), (
        parse_size(text) if text else None
    )


def servers(node: DraNode) -> list[Path]:
    return sorted(p for p in (node.root / "p" / "mps-shared").glob("*") if p.is_dir())


def test_three_share_claims_on_one_gpu_have_one_daemon_and_three_limit_sets(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    claims = prepared(  # each capped at its request: the ceilings of today's study
        dra_node,
        capped(share("asr", "uid-asr", "gpu-0-mps", 40, "16Gi"), smLimit=40),
        capped(share("tts", "uid-tts", "gpu-0-mps", 30, "8Gi"), smLimit=30),
        capped(share("emb", "uid-emb", "gpu-0-mps", 20, "4Gi"), smLimit=20),
    )
    (root,) = servers(dra_node)
    assert root.name == "gpu-0-mps-u0"
    envs = {c.uid: env_of(dra_node, c.uid) for c in claims}
    assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs.values()} == {str(root / "pipe")}
    assert {u: e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for u, e in envs.items()} == {
        "uid-asr": "40", "uid-tts": "30", "uid-emb": "20"
    }  # fmt: skip
    assert {u: e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] for u, e in envs.items()} == {
        "uid-asr": "0=16384M", "uid-tts": "0=8192M", "uid-emb": "0=4096M"
    }  # fmt: skip
    assert {u: e[cdi.CLAIM_ENV] for u, e in envs.items()} == {u: u for u in envs}
    # The ceiling: the largest share on the device, threads and memory apart.
    assert defaults(root, fake_mps_control) == (40.0, 16 << 30)
    pid = control_of(root, fake_mps_control).daemon_pid()
    gpu0 = dra_node.inventory().gpus[0].uuid
    env = daemon_env(pid)
    assert f"CUDA_VISIBLE_DEVICES={gpu0}".encode() in env

    # The largest share goes: the ceiling follows the claims left, the daemon stays.
    dra_node.kubelet.unprepare([claims[0]])
    assert servers(dra_node) == [root]
    assert control_of(root, fake_mps_control).daemon_pid() == pid
    assert defaults(root, fake_mps_control) == (30.0, 8 << 30)
    dra_node.kubelet.unprepare([claims[1]])
    assert control_of(root, fake_mps_control).daemon_pid() == pid
    dra_node.kubelet.unprepare([claims[2]])  # the last client: the daemon stops, its folder goes
    assert servers(dra_node) == []
    assert not _alive(pid)


@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_two_claims_sharing_one_mig_slice_have_one_daemon_on_that_slice(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    device = "gpu-0-mig-1g18gb-19-2-mps"
    claims = prepared(
        dra_node,
        capped(share("tts-0", "uid-t0", device, 50, "8Gi"), smLimit=50),
        capped(share("tts-1", "uid-t1", device, 25, "4Gi"), smLimit=25),
    )
    (made,) = dra_node.inventory().gpus[0].slices
    (root,) = servers(dra_node)
    pid = control_of(root, fake_mps_control).daemon_pid()
    env = daemon_env(pid)
    assert f"CUDA_VISIBLE_DEVICES={made.mig_uuid}".encode() in env
    envs = [env_of(dra_node, c.uid) for c in claims]
    assert [e["NVIDIA_VISIBLE_DEVICES"] for e in envs] == [made.mig_uuid] * 2
    assert [e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs] == ["50", "25"]
    assert defaults(root, fake_mps_control) == (50.0, 8 << 30)
    dra_node.kubelet.unprepare([claims[0]])  # the other still shares slice and daemon
    assert [s.mig_uuid for s in dra_node.inventory().gpus[0].slices] == [made.mig_uuid]
    assert control_of(root, fake_mps_control).daemon_pid() == pid
    dra_node.kubelet.unprepare([claims[1]])
    assert dra_node.inventory().gpus[0].slices == ()
    assert servers(dra_node) == []


def test_a_restarted_driver_adopts_the_daemon_and_a_killed_one_is_started_again(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    prepared(
        dra_node,
        capped(share("asr", "uid-a", "gpu-1-mps", 30, "8Gi"), smLimit=30),
        capped(share("tts", "uid-b", "gpu-1-mps", 30, "8Gi"), smLimit=30),
    )
    (root,) = servers(dra_node)
    control = control_of(root, fake_mps_control)
    pid = control.daemon_pid()
    assert pid is not None

    # A new driver on the same directories (the agent restarted): nothing is restarted, the
    # kubelet's prepare again answers the same, every limit is read back.
    old = dra_node.node
    again = NodeDriver(old.session, old.config, old.engine, old.owners)
    again.start()
    assert again.check_shares() == []
    assert control.daemon_pid() == pid
    from nodeagent.dra.claims import ClaimRef

    ref = ClaimRef("speech", "asr", "uid-a")
    assert [p.device for p in again.prepare(ref, dra_node.claim("speech", "asr"))] == ["gpu-1-mps"]
    assert control.daemon_pid() == pid
    assert defaults(root, fake_mps_control) == (30.0, 8 << 30)

    # The daemon is killed under its clients: the next check starts it again with the same
    # ceiling and names the claims it serves.
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    assert again.check_shares() == [("uid-a", "gpu-1-mps"), ("uid-b", "gpu-1-mps")]
    assert control.daemon_pid() not in (None, pid)
    assert defaults(root, fake_mps_control) == (30.0, 8 << 30)
    assert again.check_shares() == []


def test_claims_of_different_users_get_separate_daemons(dra_node: DraNode) -> None:
    a = share("asr", "uid-u0", "gpu-0-mps", 30, "8Gi")
    b = share("tts", "uid-u1000", "gpu-0-mps", 30, "8Gi")
    b["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare",
                               "user": 1000},
            },
        }
    ]  # fmt: skip
    claims = prepared(dra_node, a, b)
    assert [p.name for p in servers(dra_node)] == ["gpu-0-mps-u0", "gpu-0-mps-u1000"]
    pipes = {env_of(dra_node, c.uid)["CUDA_MPS_PIPE_DIRECTORY"] for c in claims}
    assert len(pipes) == 2


def _alive(pid: int | None) -> bool:
    from nodeagent.mps.control import process_alive

    return pid is not None and process_alive(pid)


def _wait_gone(pid: int) -> None:
    import time

    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _client(env: dict[str, str]) -> Any:
    """A process started with `env` (as a container from its claim's CDI spec would be)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, **env},
    )


@pytest.mark.parametrize("enforce", ["report", "end-client"])
def test_a_client_asking_for_more_than_its_share_is_reported_on_its_claim_within_5_s(
    dra_node: DraNode, enforce: str
) -> None:
    from nodeagent.dra.k8s.api import DraApi
    from nodeagent.dra.sharewatch import ShareWatch
    from nodeagent.kube.api import KubeSettings, make_api_client
    from nodeagent.metrics.dra import DraStats

    claims = prepared(
        dra_node,
        capped(share("asr", "uid-ok", "gpu-0-mps", 30, "8Gi"), smLimit=30),
        capped(share("tts", "uid-greedy", "gpu-0-mps", 30, "8Gi"), smLimit=30),
    )
    honest = _client(env_of(dra_node, "uid-ok"))
    # A client that rewrote its environment to ask for the whole GPU: MPS caps it at the
    # daemon's ceiling, not at its claim's share; the watch sees it.
    greedy = _client({**env_of(dra_node, "uid-greedy"), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"})
    big = _client(env_of(dra_node, "uid-ok"))
    try:
        dra_node.lib.attach("0", big.pid, 12 << 30)  # uses 12 GiB, its share is 8
        node = dra_node.node
        node.shares.clients = lambda key: [honest.pid, greedy.pid, big.pid]  # type: ignore[method-assign]
        kube = KubeSettings(node_name="node-1", host=dra_node.cluster.url, retry_seconds=1.0)
        api = DraApi(make_api_client(kube), kube)
        from nodeagent.dra.k8s.reports import StatusReports

        stats = DraStats()
        ended: list[int] = []
        watch = ShareWatch(
            node, StatusReports(api, DRIVER, "node-1"), api, stats,
            enforce=lambda: enforce, kill=ended.append,
        )  # fmt: skip
        import time

        began = time.monotonic()
        found = {(f.claim, f.reason) for f in watch.tick(dra_node.inventory())}
        assert time.monotonic() - began < 5
        assert found == {("uid-ok", "OverMemoryShare"), ("uid-greedy", "OverThreadShare")}
        conditions = {
            c.uid: [
                cond
                for e in dra_node.claim("speech", c.name)["status"].get("devices", [])
                for cond in e.get("conditions", [])
                if cond["type"] == "ShareLimits"
            ]
            for c in claims
        }
        (greedy_condition,) = conditions["uid-greedy"]
        assert greedy_condition["status"] == "False"
        assert greedy_condition["reason"] == "OverThreadShare"
        assert (
            f"client {greedy.pid} asks for 100 % of the SMs, its limit is 30 %"
            in (greedy_condition["message"])
        )
        (ok_condition,) = conditions["uid-ok"]
        assert ok_condition["reason"] == "OverMemoryShare"
        assert "uses 12288 MiB, its share is 8192 MiB" in ok_condition["message"]
        events = [
            dict(o)
            for (r, _, _), o in list(dra_node.cluster.km.objects.items())
            if "events" in str(r) and not o.deleted
        ]
        assert {(e["involvedObject"]["name"], e["reason"], e["type"]) for e in events} == {
            ("asr", "OverMemoryShare", "Warning"), ("tts", "OverThreadShare", "Warning")
        }  # fmt: skip
        assert stats.shares_over == 2
        assert dict(stats.share_findings) == {"OverMemoryShare": 1, "OverThreadShare": 1}
        assert sorted(ended) == (sorted([greedy.pid, big.pid]) if enforce == "end-client" else [])

        # Said once: a second look at the same state writes nothing more.
        watch._next = 0.0
        watch.tick(dra_node.inventory())
        assert dict(stats.share_findings) == {"OverMemoryShare": 1, "OverThreadShare": 1}
    finally:
        for p in (honest, greedy, big):
            p.kill()
            p.wait()


def test_the_share_watch_reads_the_record_once_a_tick(
    dra_node: DraNode, fake_mps_control: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its servers kept up, their clients looked at, the claims named: one read of the
    ownership record a tick (issue 43: three before)."""
    from nodeagent.dra.sharewatch import ShareWatch

    prepared(
        dra_node,
        share("asr", "uid-asr", "gpu-0-mps", 40, "16Gi"),
        share("tts", "uid-tts", "gpu-0-mps", 30, "8Gi"),
    )
    store = dra_node.node.owners
    reads: list[int] = []
    read = store.read

    def counted() -> Any:
        reads.append(1)
        return read()

    monkeypatch.setattr(store, "read", counted)
    watch = ShareWatch(dra_node.node)
    watch.tick()
    assert len(reads) == 1
    watch.tick(dra_node.inventory())
    assert len(reads) == 1  # within WATCH_SECONDS: not looked at again
    watch._next = 0.0
    watch.tick(dra_node.inventory())
    assert len(reads) == 2
