"""Whether a claim made its MIG slice (`existed`, what its unprepare leaves) is the engine's to
decide under the MIG writer lock (nodeagent.reconcile.claims `settled`), through the kubelet:
a prepare refused before anything was recorded undoes nothing it did not make."""

from __future__ import annotations

import dataclasses

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.nvml import MigWriter, Placement
from nodeagent.reconcile.claims import ChangeDone, ClaimChange
from tests.support.dra import DraNode, allocated_claim

ONE_1G = 19  # the 1g.18gb profile of an H200


def test_a_refused_prepare_leaves_a_slice_that_was_there_before_it(dra_node: DraNode) -> None:
    """The claim wants an idle slice made outside any claim (a MIG config's) and a GPU another
    claim holds: refused, the slice stays (the driver's own copy of the claim says nothing of
    what it made: the record, which never had the claim, does)."""
    other = dra_node.add_claim(allocated_claim("llm", "uid-w", {"gpu": "gpu-1"}))
    assert dra_node.kubelet.prepare([other])["uid-w"].error == ""
    writer = MigWriter(dra_node.session)
    writer.set_mig_mode(0, True)
    writer.create_compute_instance(0, writer.create_gpu_instance(0, ONE_1G, Placement(1, 1)), 1)
    assert dra_node.layout(0) == [("1g.18gb", 1)]
    both = dra_node.add_claim(
        allocated_claim("two", "uid-2", {"a": "gpu-0-mig-1g18gb-19-1", "b": "gpu-1"})
    )
    runs: list[bool] = []  # the engine's runs for the claim: release or not
    engine_run = dra_node.node._run

    def counted(change: ClaimChange) -> ChangeDone:
        runs.append(change.release)
        return engine_run(change)

    dra_node.node._run = counted  # type: ignore[method-assign]

    refused = dra_node.kubelet.prepare([both])["uid-2"]

    assert refused.error == "claim speech/two: gpu-1: claim speech/llm holds the GPU of GPU 1"
    assert dra_node.layout(0) == [("1g.18gb", 1)]
    assert "uid-2" not in dra_node.node.recorded()
    # Never recorded, so it made nothing: its undo runs no release (which would read the GPUs
    # and wait for the locks again).
    assert runs == [False]


def test_a_second_nodeagent_driver_never_takes_or_drops_a_claim_the_first_one_holds(
    dra_node: DraNode,
) -> None:
    """The record keeps one entry a claim UID: the same claim asked of a second nodeagent
    driver on the node (another driver name, the same record) is refused in one sentence, and
    its undo leaves the first driver's slice and entry as they were."""
    mine = dra_node.add_claim(allocated_claim("asr", "uid-1", {"g": "gpu-0-mig-1g18gb-19-3"}))
    assert dra_node.kubelet.prepare([mine])["uid-1"].error == ""
    entry = dra_node.node.owners.read().claims["uid-1"]
    node = dra_node.node
    config = dataclasses.replace(node.config, driver="other.nodeagent.io")
    other = NodeDriver(node.session, config, node.engine, node.owners)
    claim = allocated_claim("asr", "uid-1", {"g": "gpu-0-mig-1g18gb-19-3"})
    for result in claim["status"]["allocation"]["devices"]["results"]:
        result["driver"] = "other.nodeagent.io"

    with pytest.raises(ConfigError) as err:
        other.prepare(ClaimRef("speech", "asr", "uid-1"), claim)

    assert str(err.value) == (
        "claim speech/asr: the ownership record has the claim as prepared by DRA driver"
        " 'gpu.nodeagent.io'; one claim served by two nodeagent drivers on one node is not"
        " supported (the record keeps one entry a claim); nothing was changed"
    )
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    assert dra_node.node.owners.read().claims["uid-1"] == entry
