"""Whether a claim made its MIG slice (`existed`, what its unprepare leaves) is the engine's to
decide under the MIG writer lock (nodeagent.reconcile.claims `settled`), through the kubelet:
a prepare refused before anything was recorded undoes nothing it did not make."""

from __future__ import annotations

from nodeagent.nvml import MigWriter, Placement
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

    refused = dra_node.kubelet.prepare([both])["uid-2"]

    assert refused.error == "claim speech/two: gpu-1: claim speech/llm holds the GPU of GPU 1"
    assert dra_node.layout(0) == [("1g.18gb", 1)]
    assert "uid-2" not in dra_node.node.recorded()
