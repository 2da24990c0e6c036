"""Shares that burst (issue 45): a share claim's consumed `sm` is its request, what the
scheduler counts; its clients' SM ceiling is its limit (its MpsShare smLimit, its class's, or
the node's dra.mps-share-sm-limit, default 100), the server's ceiling the largest limit of its
claims; memory stays hard at the request; `priority: low` reaches the client as
CUDA_MPS_CLIENT_PRIORITY=1. A limit below the request is refused with nothing prepared. The
pipeline's device-plugin daemon and a share server never run on one GPU together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent.base.errors import ConfigError, MpsError
from nodeagent.dra import cdi
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.mps.manager import MpsChange, MpsIntent, MpsManager
from nodeagent.mps.regimes import MpsRegimes
from nodeagent.mps.settings import MpsSettings, validate
from tests.integration.dra.test_share_servers import (
    _client,
    capped,
    control_of,
    defaults,
    env_of,
    prepared,
    servers,
    share,
)
from tests.support.cli import Result, assert_one_error
from tests.support.dra import DRIVER, DraNode, allocated_claim, mps_config, quit_mps

kmock = pytest.importorskip("kmock")


def recorded_mps(node: DraNode, uid: str) -> dict[str, Any]:
    """The `mps` entry of the claim's one device in the ownership record."""
    (device,) = node.node.owners.read().claims[uid].devices
    assert device.mps is not None
    return dict(device.mps)


def test_a_request_alone_bursts_to_the_whole_gpu_and_memory_stays_at_the_request(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    claims = prepared(
        dra_node,
        share("asr", "uid-asr", "gpu-0-mps", 40, "16Gi"),
        share("tts", "uid-tts", "gpu-0-mps", 30, "8Gi"),
        capped(share("emb", "uid-emb", "gpu-0-mps", 20, "4Gi"), priority="low"),
    )
    envs = {c.uid: env_of(dra_node, c.uid) for c in claims}
    # No smLimit anywhere: the node's default, 100; the request is what was scheduled.
    assert {u: e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for u, e in envs.items()} == dict.fromkeys(
        envs, "100"
    )
    assert {u: e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] for u, e in envs.items()} == {
        "uid-asr": "0=16384M", "uid-tts": "0=8192M", "uid-emb": "0=4096M"
    }  # fmt: skip
    assert {u: e["CUDA_MPS_CLIENT_PRIORITY"] for u, e in envs.items()} == {
        "uid-asr": "0", "uid-tts": "0", "uid-emb": "1"
    }  # fmt: skip
    (root,) = servers(dra_node)
    assert defaults(root, fake_mps_control) == (100.0, 16 << 30)  # the largest limit
    assert {c.uid: recorded_mps(dra_node, c.uid)["thread_percentage"] for c in claims} == {
        "uid-asr": 40, "uid-tts": 30, "uid-emb": 20
    }  # fmt: skip
    emb = recorded_mps(dra_node, "uid-emb")
    assert (emb["sm_limit_percent"], emb["priority"]) == (100, "low")
    assert recorded_mps(dra_node, "uid-asr")["priority"] == "normal"
    # What the claim got, in its status.devices entry: request, limit, memory, priority.
    (entry,) = dra_node.claim("speech", "emb")["status"]["devices"]
    assert entry["data"]["mps"] == {
        "threadPercentage": 20, "smLimitPercent": 100, "pinnedMemoryBytes": 4 << 30,
        "priority": "low",
    }  # fmt: skip
    (ready,) = [c for c in entry["conditions"] if c["type"] == "Ready"]
    assert (
        "20 % of its SMs requested, up to 100 %, 4096 MiB pinned memory, low priority"
        in (ready["message"])
    )


def test_the_server_ceiling_is_the_largest_limit_and_follows_the_claims_left(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    claims = prepared(
        dra_node,
        capped(share("asr", "uid-a", "gpu-1-mps", 20, "8Gi"), smLimit=70),
        capped(share("tts", "uid-b", "gpu-1-mps", 30, "8Gi"), smLimit=50),
    )
    assert env_of(dra_node, "uid-a")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70"
    assert env_of(dra_node, "uid-b")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    (root,) = servers(dra_node)
    assert defaults(root, fake_mps_control)[0] == 70.0
    dra_node.kubelet.unprepare([claims[0]])
    assert defaults(root, fake_mps_control)[0] == 50.0


def test_a_limit_below_the_request_is_refused_in_one_sentence_with_nothing_prepared(
    dra_node: DraNode,
) -> None:
    claim = dra_node.add_claim(capped(share("asr", "uid-low", "gpu-0-mps", 40, "8Gi"), smLimit=30))
    (result,) = dra_node.kubelet.prepare([claim]).values()
    assert result.error.endswith(
        "claim speech/asr: gpu-0-mps: smLimit 30 is below the claim's request of 40 % of the"
        " SMs; a limit is between the request and 100"
    )
    assert "\n" not in result.error
    assert servers(dra_node) == []
    assert not cdi.spec_file(dra_node.cdi_dir, DRIVER, "uid-low").exists()
    assert "uid-low" not in dra_node.node.owners.read().claims


def test_the_nodes_default_limit_applies_where_no_config_sets_one(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    old = dra_node.node
    node = NodeDriver(old.session, replace(old.config, share_sm_limit=60), old.engine, old.owners)
    node.start()
    for name, uid, sm in (("asr", "uid-60", 30), ("tts", "uid-big", 80)):
        dra_node.add_claim(share(name, uid, "gpu-0-mps", sm, "8Gi"))
        node.prepare(ClaimRef("speech", name, uid), dra_node.claim("speech", name))
    assert env_of(dra_node, "uid-60")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    # A default below a claim's request gives that claim its request.
    assert env_of(dra_node, "uid-big")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "80"
    (root,) = servers(dra_node)
    assert defaults(root, fake_mps_control)[0] == 80.0


def test_a_client_bursting_up_to_its_limit_is_within_its_share_above_it_is_not(
    dra_node: DraNode,
) -> None:
    from nodeagent.dra.sharewatch import ShareWatch

    prepared(dra_node, capped(share("asr", "uid-b", "gpu-0-mps", 20, "8Gi"), smLimit=60))
    env = env_of(dra_node, "uid-b")
    bursting = _client({**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "60"})
    try:
        node = dra_node.node
        node.shares.clients = lambda key: [bursting.pid]  # type: ignore[method-assign]
        watch = ShareWatch(node)
        assert [f.reason for f in watch.tick(dra_node.inventory())] == ["WithinShare"]
        greedy = _client({**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "61"})
        try:
            node.shares.clients = lambda key: [greedy.pid]  # type: ignore[method-assign]
            watch._next = 0.0
            (found,) = watch.tick(dra_node.inventory())
            assert (found.reason, found.message) == (
                "OverThreadShare",
                f"client {greedy.pid} asks for 61 % of the SMs, its limit is 60 %",
            )
        finally:
            greedy.kill()
            greedy.wait()
    finally:
        bursting.kill()
        bursting.wait()


def _pipeline_intent(node: DraNode, control: str, gpu: int) -> MpsIntent:
    root = node.root / "dp"
    settings = MpsSettings(
        devices=(gpu,), replicas=4, pipe_dir=root / "pipe", log_dir=root / "log",
        ready_file=root / "ready", control_binary=control, command_timeout_seconds=2.0,
    )  # fmt: skip
    return MpsIntent(settings, validate(settings, node.inventory()))


def test_the_device_plugin_daemon_and_a_share_server_exclude_each_other_on_one_gpu(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    manager = MpsManager(regimes=dra_node.node.daemons.regimes)  # as the agent wires them
    pipe = dra_node.root / "dp"
    try:
        manager.apply(MpsChange("start", _pipeline_intent(dra_node, fake_mps_control, 0)))
        # A share server on the pipeline's GPU: refused, naming the other, nothing prepared.
        claim = dra_node.add_claim(share("asr", "uid-x", "gpu-0-mps", 30, "8Gi"))
        (result,) = dra_node.kubelet.prepare([claim]).values()
        assert "GPU 0 runs the device-plugin path's MPS daemon (mps.devices); the DRA MPS" in (
            result.error
        )
        assert "share server gpu-0-mps-u0 is not started beside it" in result.error
        assert servers(dra_node) == []
        assert "uid-x" not in dra_node.node.owners.read().claims

        # A share server on GPU 1 first: the pipeline's daemon is refused there.
        prepared(dra_node, share("tts", "uid-y", "gpu-1-mps", 30, "8Gi"))
        manager.apply(MpsChange("stop"))
        with pytest.raises(MpsError) as err:
            manager.apply(MpsChange("start", _pipeline_intent(dra_node, fake_mps_control, 1)))
        assert str(err.value).startswith(
            "GPU 1 runs the DRA MPS share server gpu-1-mps-u0; the device-plugin path's MPS"
            " daemon (mps.devices) is not started beside it"
        )
        assert manager.daemon is None
        assert control_of(pipe, fake_mps_control).daemon_pid() is None

        # The pipeline's daemon gone, GPU 0 takes a share server again.
        prepared(dra_node, share("emb", "uid-z", "gpu-0-mps", 30, "8Gi"))
        assert [p.name for p in servers(dra_node)] == ["gpu-0-mps-u0", "gpu-1-mps-u0"]
    finally:
        manager.shutdown(stop_daemon=True)
        quit_mps(fake_mps_control, pipe)


def test_a_daemon_found_running_with_other_limits_is_held_to_the_same_exclusion(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    """A fresh process's plan finds a daemon on the GPU with other limits ('limits': taken
    over, its limits set): taking it over is refused beside a share server, as a start is."""
    prepared(dra_node, share("asr", "uid-l", "gpu-0-mps", 30, "8Gi"))
    manager = MpsManager(regimes=dra_node.node.daemons.regimes)
    intent = _pipeline_intent(dra_node, fake_mps_control, 0)
    with pytest.raises(MpsError, match="GPU 0 runs the DRA MPS share server gpu-0-mps-u0"):
        manager.apply(MpsChange("limits", intent, "a running daemon, adopted"))
    assert manager.daemon is None
    assert control_of(dra_node.root / "dp", fake_mps_control).daemon_pid() is None


def test_a_restarted_driver_knows_the_share_servers_it_adopts(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    prepared(dra_node, share("asr", "uid-r", "gpu-0-mps", 30, "8Gi"))
    old = dra_node.node
    again = NodeDriver(old.session, old.config, old.engine, old.owners)
    again.start()
    manager = MpsManager(regimes=again.daemons.regimes)
    with pytest.raises(MpsError, match="GPU 0 runs the DRA MPS share server gpu-0-mps-u0"):
        manager.apply(MpsChange("start", _pipeline_intent(dra_node, fake_mps_control, 0)))
    assert manager.daemon is None


def test_an_mps_share_config_without_a_user_keeps_the_pods_user(dra_node: DraNode) -> None:
    """An MpsShare that sets only smLimit and priority says no user: the pods' runAsUser
    decides it as before (nodeagent.dra.users), and the limit and priority stay."""
    from tests.integration.dra.test_share_users import add_pod, container

    claim = capped(share("asr", "uid-s", "gpu-0-mps", 30, "8Gi"), smLimit=50, priority="low")
    add_pod(dra_node, claim, "asr-0", [container("asr")], pod_user=1000)
    prepared(dra_node, claim)
    assert [p.name for p in servers(dra_node)] == ["gpu-0-mps-u1000"]
    env = env_of(dra_node, "uid-s")
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_CLIENT_PRIORITY"]) == (
        "50",
        "1",
    )
    mps = recorded_mps(dra_node, "uid-s")
    assert (mps["user"], mps["sm_limit_percent"], mps["priority"]) == (1000, 50, "low")


def test_a_limit_over_100_is_refused(dra_node: DraNode, tmp_path: Path) -> None:
    claim = dra_node.add_claim(capped(share("asr", "uid-o", "gpu-0-mps", 30, "8Gi"), smLimit=101))
    (result,) = dra_node.kubelet.prepare([claim]).values()
    assert "MpsShare: smLimit must be a whole percentage 1-100, not 101" in result.error
    assert servers(dra_node) == []
    with pytest.raises(ConfigError):
        dra_node.node.prepare(ClaimRef("speech", "asr", "uid-o"), dra_node.claim("speech", "asr"))


def test_the_share_watch_keeps_the_servers_up_on_its_own(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    """The watch reads the GPUs itself (its own worker, no slice publish behind it): a killed
    server is started again at its next look, and its claims say so."""
    import os
    import signal

    from nodeagent.dra.sharewatch import ShareWatch
    from tests.integration.dra.test_share_servers import _wait_gone

    watch = ShareWatch(dra_node.node)
    assert watch.tick() == []  # no share claim: nothing read, nothing said
    prepared(dra_node, share("asr", "uid-w", "gpu-0-mps", 30, "8Gi"))
    (root,) = servers(dra_node)
    pid = control_of(root, fake_mps_control).daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    watch._next = 0.0
    assert [(f.claim, f.reason) for f in watch.tick()] == [("uid-w", "ServerRestarted")]
    assert control_of(root, fake_mps_control).daemon_pid() not in (None, pid)


SPLIT = """version: nodeagent/v1
sharing-configs:
  m:
    - devices: [0]
      mps: {replicas: 4}
"""
# A claim with an MPS daemon on GPU 0 (made fresh for each test), and how each side names it.
GPU0_DAEMONS: dict[str, tuple[Callable[[], dict[str, Any]], str, str]] = {
    "share-server": (
        lambda: share("asr", "uid-x", "gpu-0-mps", 30, "8Gi"),
        "the DRA MPS share server gpu-0-mps-u0",
        "the DRA MPS share server gpu-0-mps-u0",
    ),
    "mps-config-daemon": (
        lambda: allocated_claim("asr", "uid-x", {"gpu": "gpu-0"}, mps_config(25)),
        "the DRA MPS daemon of claim speech/asr",
        "the DRA MPS daemon of device gpu-0 (claim UID uid-x)",
    ),
}


def _sharing_apply(node: DraNode, cli: Callable[..., Result], control: str) -> Result:
    """`sharing apply` of the device-plugin path's daemon on GPU 0, in <root>/dp (flat)."""
    config = node.root / "sharing.yaml"
    config.write_text(SPLIT)
    sim = ["--simulate", "h200x2", "--sim-state", str(node.state)]
    flags = ["--mps-root", str(node.root / "dp"), "--mps-control", control, "--mps-layout", "flat"]
    return cli(*sim, "sharing", "apply", "-f", str(config), "-c", "m", *flags)


@pytest.mark.parametrize("kind", sorted(GPU0_DAEMONS))
def test_another_process_never_starts_the_device_plugin_daemon_beside_a_claims_daemon(
    dra_node: DraNode, fake_mps_control: str, cli: Callable[..., Result], kind: str
) -> None:
    """`sharing apply` builds an MPS manager of its own: it knew nothing of the agent's share
    servers and started a second daemon on GPU 0 (exit 0, 'MPS daemon: start'). The claims'
    daemons are in the ownership record, which every pipeline reads."""
    claim, words, _ = GPU0_DAEMONS[kind]
    prepared(dra_node, claim())
    pipe = dra_node.root / "dp"
    try:
        assert_one_error(
            _sharing_apply(dra_node, cli, fake_mps_control), 3,
            f"GPU 0 runs {words}; the device-plugin path's MPS daemon (mps.devices) is not"
            " started beside it",
        )  # fmt: skip
        assert control_of(pipe, fake_mps_control).daemon_pid() is None
    finally:
        quit_mps(fake_mps_control, pipe)


@pytest.mark.parametrize("kind", sorted(GPU0_DAEMONS))
def test_a_claims_daemon_is_never_started_beside_another_processs_device_plugin_daemon(
    dra_node: DraNode, fake_mps_control: str, cli: Callable[..., Result], kind: str
) -> None:
    """The pipeline's daemon started by `sharing apply` (a process with regimes of its own):
    the driver knew only its own process's daemon and started a second one on GPU 0. It looks
    in the pipe directory its settings name (as the agent's factory wires it)."""
    claim, _, words = GPU0_DAEMONS[kind]
    pipe = dra_node.root / "dp"
    old = dra_node.node
    driver = NodeDriver(
        old.session, old.config, old.engine, old.owners, regimes=MpsRegimes(lambda: pipe / "pipe")
    )
    try:
        done = _sharing_apply(dra_node, cli, fake_mps_control)
        assert done.returncode == 0, done.stderr
        pid = control_of(pipe, fake_mps_control).daemon_pid()
        assert pid is not None
        dra_node.add_claim(claim())
        with pytest.raises(MpsError) as err:
            driver.prepare(ClaimRef("speech", "asr", "uid-x"), dra_node.claim("speech", "asr"))
        assert str(err.value) == (
            "GPU 0 runs the device-plugin path's MPS daemon (mps.devices) (pid"
            f" {pid}, started by another process); {words} is not started beside it (two MPS"
            " daemons on one GPU are time-sliced against each other): leave GPU 0 out of"
            " mps.devices or of dra.devices"
        )
        assert servers(dra_node) == [] and "uid-x" not in dra_node.node.owners.read().claims
    finally:
        quit_mps(fake_mps_control, pipe)
