"""The agent is wired before it is built (nodeagent.agent.factory.build_agent): one pipeline
from the start, with the Node's ports; starting the agent connects them to the API server and
serves the DRA plugin on that same pipeline, and builds no second one."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cluster import kube_group
from tests.support.dra import NODE, dra_cluster, dra_group

pytest.importorskip("kmock")


def test_one_pipeline_from_build_to_run_with_kube_and_dra(short_root: Path) -> None:
    cluster = dra_cluster()
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    lib = SimulatedNvml(parse_spec("h200x2"))
    agent = make_agent(
        NvmlSession(lib),
        lib.reset,
        reconcile={"interval_seconds": 300},
        kube=kube_group(cluster, NODE),
        dra=dra_group(short_root),
    )
    built = agent.pipeline
    assert agent.dra is None and agent.watcher is None  # nothing asked of the API server yet
    assert cluster.writes() == 0
    try:
        agent.start()
        assert agent.pipeline is built
        assert agent.dra is not None and agent.dra.node.engine is built
        assert agent.watcher is not None and agent.watcher.view.labels()
        report = built.last_report
        assert report is not None and report.result == "success", report
        assert cluster.labels(NODE)["nvidia.com/gpu.count"] == "2"  # published by that pipeline
        # One MPS regime per GPU: the DRA share servers and the pipeline's daemon share a referee.
        assert agent.dra.node.daemons.regimes is built.mps.regimes
        # The share watch has a worker of its own, not the slice publisher's tick.
        assert agent.workers["dra-shares"].is_alive()
    finally:
        agent.stop()
        cluster.close()
