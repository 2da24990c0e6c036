"""Share claims of one device let go at once, or beside an admin-access claim: the last one
to go takes the MIG slice the shares made and stops their server; nothing is left that no
claim holds (the kubelet's unprepares run side by side, each from the record as it read it)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from nodeagent.base.errors import LockHeld
from nodeagent.base.lock import mig_writer_lock
from nodeagent.dra.node import claim_device
from nodeagent.dra.sharewatch import ShareWatch
from nodeagent.reconcile.claims import ChangeDone, ClaimChange
from nodeagent.state.held import PREPARED
from tests.integration.dra.test_share_servers import (
    _wait_gone,
    capped,
    control_of,
    defaults,
    prepared,
    servers,
    share,
)
from tests.support.dra import DraNode

MIG_SHARE = "gpu-0-mig-1g18gb-19-2-mps"


def _together(node: DraNode, uids: list[str], hold: Callable[[DraNode], None]) -> None:
    """Unprepare `uids` on threads of their own, `hold` making them meet halfway."""
    hold(node)
    errors: list[BaseException] = []

    def go(uid: str) -> None:
        try:
            node.node.unprepare(uid)
        except BaseException as err:  # the test's failure, said below
            errors.append(err)

    threads = [threading.Thread(target=go, args=(u,)) for u in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def _both_read_first(node: DraNode) -> None:
    """Each release reads the record before either writes it (the race)."""
    engine, store = node.node.engine, node.node.owners
    original = engine.run_change
    met = threading.Barrier(2, timeout=10)

    def run_change(change: ClaimChange) -> ChangeDone:
        if change.release and change.read is None:
            read = store.read()
            met.wait()
            change = replace(change, read=read)
        return original(change)

    engine.run_change = run_change  # type: ignore[method-assign]


def _both_leave_the_server_first(node: DraNode) -> None:
    """Each claim leaves the server before the record lets go of either."""
    daemons = node.node.daemons
    original = daemons.stop
    met = threading.Barrier(2, timeout=10)

    def stop(*args: object) -> None:
        original(*args)  # type: ignore[arg-type]
        met.wait()

    daemons.stop = stop  # type: ignore[method-assign]


@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_two_shares_of_a_slice_let_go_at_once_take_the_slice(dra_node: DraNode) -> None:
    prepared(
        dra_node,
        capped(share("tts-0", "uid-t0", MIG_SHARE, 50, "8Gi"), smLimit=50),
        capped(share("tts-1", "uid-t1", MIG_SHARE, 25, "4Gi"), smLimit=25),
    )
    assert len(dra_node.inventory().gpus[0].slices) == 1

    _together(dra_node, ["uid-t0", "uid-t1"], _both_read_first)

    assert dra_node.node.owners.read().claims == {}
    assert dra_node.inventory().gpus[0].slices == ()
    assert servers(dra_node) == []


@pytest.mark.parametrize("device", ["gpu-0-mps", MIG_SHARE])
@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_two_shares_leaving_their_server_at_once_stop_it(dra_node: DraNode, device: str) -> None:
    prepared(
        dra_node,
        capped(share("tts-0", "uid-t0", device, 50, "8Gi"), smLimit=50),
        capped(share("tts-1", "uid-t1", device, 25, "4Gi"), smLimit=25),
    )
    assert len(servers(dra_node)) == 1

    _together(dra_node, ["uid-t0", "uid-t1"], _both_leave_the_server_first)

    assert dra_node.node.owners.read().claims == {}
    assert servers(dra_node) == []
    assert dra_node.node.check_shares() == []  # nothing the watch would start again


@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_admin_access_to_a_share_keeps_no_slice(dra_node: DraNode) -> None:
    """Admin access to the share device the first share made: the share's unprepare takes
    the slice (admin access holds nothing), and the admin claim's leaves nothing behind."""
    (first,) = prepared(dra_node, capped(share("tts-0", "uid-t0", MIG_SHARE, 50, "8Gi")))
    admin = share("watch", "uid-adm", MIG_SHARE, 50, "8Gi")
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    (watcher,) = prepared(dra_node, admin)

    assert dra_node.kubelet.unprepare([first]) == {"uid-t0": ""}
    assert dra_node.kubelet.unprepare([watcher]) == {"uid-adm": ""}

    assert dra_node.node.owners.read().claims == {}
    assert dra_node.inventory().gpus[0].slices == ()


def test_the_watch_never_starts_a_server_again_for_claims_gone_since_its_read(
    dra_node: DraNode,
) -> None:
    """The share watch read the record (two claims on a server), then waited on NVML; the
    kubelet let go of both meanwhile: the watch starts nothing (the claims a stopped server
    serves are read again under its lock), and no GPU stays a share server's."""
    a, b = prepared(
        dra_node,
        capped(share("a", "uid-a", "gpu-0-mps", 30, "8Gi"), smLimit=30),
        capped(share("b", "uid-b", "gpu-0-mps", 20, "4Gi"), smLimit=20),
    )
    node = dra_node.node
    reached, go = threading.Event(), threading.Event()
    original = node.check_shares

    def held(servers: Any = None) -> list[tuple[str, str]]:
        reached.set()
        assert go.wait(30)
        return original(servers)

    node.check_shares = held  # type: ignore[method-assign]
    tick = threading.Thread(target=ShareWatch(node).tick)
    tick.start()
    assert reached.wait(30)
    assert dra_node.kubelet.unprepare([a, b]) == {"uid-a": "", "uid-b": ""}
    go.set()
    tick.join(30)

    assert servers(dra_node) == []
    node.daemons.regimes.pipeline((0,))  # GPU 0 is no share server's: the pipeline's may run
    node.daemons.regimes.pipeline(())


def test_a_server_started_again_has_the_ceiling_of_the_claims_it_serves_then(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    """The watch's read had one claim (limit 30); one with limit 80 came since, and the
    server died: it is started again with 80, the largest limit of the claims it serves."""
    prepared(dra_node, capped(share("a", "uid-a", "gpu-0-mps", 30, "8Gi"), smLimit=30))
    node = dra_node.node
    earlier = node.share_clients()  # the watch's read
    prepared(dra_node, capped(share("d", "uid-d", "gpu-0-mps", 60, "16Gi"), smLimit=80))
    (root,) = servers(dra_node)
    pid = control_of(root, fake_mps_control).daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)

    assert sorted(node.check_shares(earlier)) == [("uid-a", "gpu-0-mps"), ("uid-d", "gpu-0-mps")]
    assert defaults(root, fake_mps_control) == (80.0, 16 << 30)


def test_a_claim_gone_leaves_no_lock_behind(dra_node: DraNode) -> None:
    for i in range(5):
        (c,) = prepared(dra_node, share(f"c{i}", f"uid-{i}", "gpu-0-mps", 10, "1Gi"))
        assert dra_node.kubelet.unprepare([c]) == {c.uid: ""}
    assert dra_node.node._claims == {}


@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_a_share_whose_unprepare_failed_is_served_again(dra_node: DraNode) -> None:
    """A share's unprepare left its server, then gave up on the MIG writer lock (another
    writer held it past the deadline): the record still has the claim prepared, so it is the
    server's client again; asked again it is answered from the record, and the other share's
    unprepare leaves the server running for it. The kubelet's retry lets go of it in the end."""
    a, b = prepared(
        dra_node,
        capped(share("tts-0", "uid-t0", MIG_SHARE, 50, "8Gi"), smLimit=50),
        capped(share("tts-1", "uid-t1", MIG_SHARE, 25, "4Gi"), smLimit=25),
    )
    node = dra_node.node
    got, done = threading.Event(), threading.Event()

    def writer() -> None:  # a MIG config's apply in another process, say
        with mig_writer_lock(dra_node.root / ".sim.json.lock", 5):
            got.set()
            done.wait(10)

    other = threading.Thread(target=writer)
    other.start()
    try:
        assert got.wait(5)
        with pytest.raises(LockHeld):
            node.unprepare("uid-t0", deadline=time.monotonic() + 0.3)
    finally:
        done.set()
        other.join(10)
    assert node.owners.read().claims["uid-t0"].state == PREPARED

    assert dra_node.kubelet.prepare([a])["uid-t0"].error == ""  # answered from the record
    assert dra_node.kubelet.unprepare([b]) == {"uid-t1": ""}
    assert len(servers(dra_node)) == 1  # still serving the claim the record has prepared
    (device,) = node.recorded()["uid-t0"].devices
    assert node.daemons.pid(claim_device("uid-t0", device)) is not None
    assert node.check_shares() == []  # running: nothing for the watch to start

    assert dra_node.kubelet.unprepare([a]) == {"uid-t0": ""}
    assert node.owners.read().claims == {}
    assert servers(dra_node) == [] and dra_node.inventory().gpus[0].slices == ()
