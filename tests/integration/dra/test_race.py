"""Two claims racing for overlapping placements of one GPU (a scheduler working from stale
slices, or two of them): one wins, the other is refused with a sentence naming the winner,
and the GPU holds exactly the winner's slice."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.base.errors import AgentError
from nodeagent.dra.checkpoint import load
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.dra.traces import claim_holders
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.dra import CLAIMS, DraNode, allocated_claim, no_reset, node_config
from tests.support.fake_kubelet.dra import PrepareResult

PAIRS = [
    ("gpu-0-mig-2g35gb-14-0", "gpu-0-mig-1g18gb-19-1"),  # slices 0-1 and 1
    ("gpu-0-mig-7g141gb-0-0", "gpu-0-mig-3g71gb-9-4"),  # all and 4-7
    ("gpu-0", "gpu-0-mig-1g35gb-15-6"),  # the whole GPU and 6-7
]


def race(calls: dict[str, object]) -> dict[str, PrepareResult]:
    """Run each call on its own thread, all released at once; their results by name."""
    barrier = threading.Barrier(len(calls))
    results: dict[str, PrepareResult] = {}

    def go(name: str, call: object) -> None:
        barrier.wait()
        results[name] = call()  # type: ignore[operator]

    threads = [threading.Thread(target=go, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_one_claim_wins_through_the_kubelet(dra_node: DraNode, a: str, b: str) -> None:
    for round_ in range(3):
        claims = {
            "a": dra_node.add_claim(allocated_claim(f"a{round_}", f"uid-a{round_}", {"g": a})),
            "b": dra_node.add_claim(allocated_claim(f"b{round_}", f"uid-b{round_}", {"g": b})),
        }
        results = race(
            {k: (lambda c=c: dra_node.kubelet.prepare([c])[c.uid]) for k, c in claims.items()}
        )
        (winner,) = [k for k, r in results.items() if not r.error]
        loser = "b" if winner == "a" else "a"
        assert f"claim speech/{winner}{round_} holds" in results[loser].error
        device = a if winner == "a" else b
        if device == "gpu-0":
            assert dra_node.layout(0) == []
        else:
            assert len(dra_node.layout(0)) == 1
        assert set(load(dra_node.checkpoint).claims) == {claims[winner].uid}
        assert len(claim_holders(dra_node.checkpoint)) == 1
        assert not list(dra_node.cdi_dir.glob(f"*{claims[loser].uid}*"))
        assert dra_node.kubelet.unprepare([claims[winner]]) == {claims[winner].uid: ""}
        assert dra_node.layout(0) == []


def test_two_drivers_sharing_the_node_never_both_win(short_root: Path) -> None:
    """Two plugin processes at once (an old agent still stopping): the MIG writer lock and
    the checkpoint read under it keep them apart."""
    state, lock = short_root / "sim.json", short_root / ".sim.json.lock"

    def make() -> NodeDriver:
        session = NvmlSession(SimulatedNvml(parse_spec("h200x2"), state))
        return dra_driver(session, Settings(), node_config(short_root), no_reset, lock)

    first, second = make(), make()
    claims = {
        "a": allocated_claim("a", "uid-a", {"g": "gpu-1-mig-4g71gb-5-0"}),
        "b": allocated_claim("b", "uid-b", {"g": "gpu-1-mig-1g18gb-19-3"}),
    }

    def call(node: NodeDriver, name: str) -> PrepareResult:
        try:
            node.prepare(ClaimRef("speech", name, f"uid-{name}"), claims[name])
        except AgentError as err:
            return PrepareResult((), str(err))
        return PrepareResult()

    results = race({"a": lambda: call(first, "a"), "b": lambda: call(second, "b")})
    assert sorted(bool(r.error) for r in results.values()) == [False, True]
    (winner,) = [k for k, r in results.items() if not r.error]
    assert set(load(short_root / "p" / "checkpoint.json").claims) == {f"uid-{winner}"}
    reader = NvmlSession(SimulatedNvml(parse_spec("h200x2"), state))
    slices = read_inventory(reader).gpus[1].slices
    want = ("4g.71gb", 0) if winner == "a" else ("1g.18gb", 3)
    assert [(s.profile, s.placement.start) for s in slices] == [want]
    assert "holds memory slices" in results["b" if winner == "a" else "a"].error


def test_a_prepare_that_read_its_claim_before_the_unprepare_prepares_nothing(
    dra_node: DraNode,
) -> None:
    """The kubelet's prepare reads its claim; the claim is deleted and the kubelet unprepares
    it (nothing prepared yet: done) before the prepare goes on. Before, the prepare then made
    the slice and recorded the claim after its unprepare, and nothing ever undid it."""
    as_read = allocated_claim("late", "uid-late", {"g": "gpu-0-mig-2g35gb-14-0"})
    claim = dra_node.add_claim(dict(as_read))
    read, go_on = threading.Event(), threading.Event()

    async def slow_read() -> dict[str, object]:
        """The claim as it was read, answered once the test lets the read go on."""
        read.set()
        while not go_on.is_set():
            await asyncio.sleep(0.01)
        return as_read

    def is_the_read(request: Any) -> bool:
        method = str(getattr(request.method, "value", request.method)).upper()
        return method == "GET" and request.url.path.endswith("/resourceclaims/late")

    cluster = dra_node.cluster
    cluster.on_loop(lambda: cluster.km[is_the_read][0:1] << slow_read)
    results: dict[str, PrepareResult] = {}
    preparing = threading.Thread(target=lambda: results.update(dra_node.kubelet.prepare([claim])))
    preparing.start()
    assert read.wait(30), "the prepare did not read its claim"
    del cluster.km.objects[CLAIMS, "speech", "late"]  # deleted: the kubelet unprepares
    assert dra_node.kubelet.unprepare([claim]) == {claim.uid: ""}
    go_on.set()
    preparing.join(60)

    assert results[claim.uid].error == (
        "claim speech/late was unprepared while this prepare read it (the claim was deleted, or"
        " the kubelet let go of it): nothing was prepared; the kubelet asks again if a pod still"
        " needs it"
    )
    assert dra_node.layout(0) == []  # no slice made for a claim that is gone
    assert dra_node.stats is not None and dra_node.stats.refusals["superseded"] == 1  # not "other"
    assert load(dra_node.checkpoint).claims == {}
    assert not list(dra_node.cdi_dir.glob("*uid-late*"))
    # A prepare that begins after the unprepare is the kubelet's new ask: it prepares.
    dra_node.add_claim(dict(as_read))
    assert not dra_node.kubelet.prepare([claim])[claim.uid].error
    assert dra_node.layout(0) == [("2g.35gb", 0)]
    assert dra_node.kubelet.unprepare([claim]) == {claim.uid: ""}
    assert dra_node.layout(0) == []
