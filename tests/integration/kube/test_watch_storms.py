"""Watches that storm or swell (issue 44, class 3), against a real HTTP API (kmock) that
misbehaves: an API server, or a proxy in front of it, that answers every watch with 200 and an
empty body, and one that streams a line that never ends."""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.kube.api import KubeSettings, NodeApi, make_api_client
from nodeagent.kube.controller import NodeView, NodeWatcher
from nodeagent.kube.transport import MAX_LINE_BYTES
from tests.support.agent import Agents, emulated_node, generated_mig_file
from tests.support.cli import captured_logs
from tests.support.cluster import Cluster, kube_group
from tests.support.wait import wait_for

NODE = "gpu-node-1"
WINDOW_SECONDS = 6.0


@pytest.fixture
def empty_watches(cluster: Cluster) -> Iterator[list[float]]:
    """Every watch answered 200 with an empty body; yields the moments they came."""
    came: list[float] = []

    def empty(request: Any) -> bytes:
        came.append(time.monotonic())
        return b""

    cluster.on_loop(lambda: cluster.km[lambda r: r.params.get("watch") == "true"] << empty)
    yield came


def test_watches_that_end_at_once_are_backed_off_not_repeated(
    cluster: Cluster, agents: Agents, tmp_path: Path, empty_watches: list[float]
) -> None:
    """The agent as it runs (its kube-watch worker): before, it watched again at once, some
    1,500-2,000 requests a second; now each empty watch is a failure and the next waits the
    informer's jittered backoff (up to 1, 2, 4 s...)."""
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    lib, session = emulated_node()
    mig = generated_mig_file(session, tmp_path / "mig.yaml")
    with captured_logs("error") as logs:
        agents.start(session, lib.reset, mig={"config_file": str(mig)},
                     kube=kube_group(cluster, NODE))  # fmt: skip
        wait_for(lambda: empty_watches, "the first watch", 30)
        first = empty_watches[0]
        time.sleep(WINDOW_SECONDS)
    within = [t for t in empty_watches if t - first < WINDOW_SECONDS]
    # The worker's 1 s and a random wait up to 1, 2, 4 s: at most about 6 in the window.
    assert len(within) <= 10, len(within)
    failed = [e for e in logs if e["event"] == "worker.failed" and e["worker"] == "kube-watch"]
    assert failed and "ended after" in failed[0]["error"], failed
    assert "no event (a very short watch" in failed[0]["error"]
    assert not any(e.get("exc_info") for e in failed)  # a sentence, no traceback


def _endless(sent: list[int], seconds: float) -> Any:
    """A watch answer of one line that never ends (for `seconds` at most); `sent` counts its
    bytes."""

    async def stream(request: Any) -> AsyncIterator[bytes]:
        yield b'{"type": "ADDED", "object": {"metadata": {"name": "'
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            sent[0] += 1 << 16
            yield b"x" * (1 << 16)
            await asyncio.sleep(0)

    return stream


def test_a_watch_line_that_never_ends_is_cut_at_its_bound(cluster: Cluster) -> None:
    """Before, the agent held the whole line: 230-362 MiB more in 15 s. Now the watch ends
    once the line passes MAX_LINE_BYTES, with a sentence, and the agent's memory stays near
    that bound."""
    cluster.add_node(NODE)
    sent = [0]
    cluster.on_loop(
        lambda: cluster.km[lambda r: r.params.get("watch") == "true"] << _endless(sent, 20)
    )
    kube = KubeSettings(node_name=NODE, host=cluster.url, watch_timeout_seconds=30)
    stop = threading.Event()
    api = NodeApi(make_api_client(kube), kube, stop)
    watcher = NodeWatcher(api, NodeView(), lambda: None, stop)
    tracemalloc.start()
    try:
        started = time.monotonic()
        with pytest.raises(KubeError) as err:
            watcher.cycle()
        took = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        stop.set()
    assert str(err.value) == (
        f"Kubernetes API: watch node {NODE} failed: a watch line is over 16 MiB, longer than"
        " any event of a Kubernetes API server (its largest object is about 3 MiB): the watch"
        " was ended"
    )
    assert took < 15, took
    assert peak < 3 * MAX_LINE_BYTES, peak >> 20
