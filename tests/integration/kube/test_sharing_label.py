"""The node label `nodeagent.io/sharing.config` selects a per-GPU sharing config, with the same
protocol as `nvidia.com/mig.config`: its own state label, reason annotation and Events."""

from __future__ import annotations

from pathlib import Path

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cluster import Cluster

NODE = "gpu-node-9"
STATE = "nodeagent.io/sharing.config.state"
CONFIGS = """version: nodeagent/v1
sharing-configs:
  split:
    - devices: [0]
      mig: {mig-devices: {"3g.71gb": 2}}
    - devices: [1]
      time-slicing: {replicas: 4}
"""


def test_sharing_label_protocol(cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_node(NODE, {"team": "ml"})
    lib = SimulatedNvml(parse_spec("h200x2"))
    (tmp_path / "sharing.yaml").write_text(CONFIGS)
    agent = make_agent(
        NvmlSession(lib),
        lib.reset,
        sharing={"config_file": str(tmp_path / "sharing.yaml")},
        reconcile={"interval_seconds": 300},
        kube={
            "enabled": True, "node_name": NODE, "host": cluster.url,
            "watch_timeout_seconds": 1, "pod_resources_socket": None,
        },
    )  # fmt: skip
    agent.start()
    try:
        cluster.label(NODE, {"nodeagent.io/sharing.config": "split"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
        labels = cluster.wait(
            lambda: cluster.labels(NODE).get("nodeagent.io/gpu.1.sharing") and cluster.labels(NODE),
            what="per-GPU labels",
        )
        assert labels["nodeagent.io/gpu.0.sharing"] == "mig"
        assert labels["nodeagent.io/gpu.1.sharing"] == "time-slicing"
        assert labels["nodeagent.io/gpu.1.replicas"] == "4"
        assert labels["nvidia.com/mig-3g.71gb.count"] == "2"
        assert "nvidia.com/mig.config.state" not in labels  # the other protocol is untouched
        reasons = [e["reason"] for e in cluster.events()]
        assert "SharingConfigChanging" in reasons and "SharingConfigApplied" in reasons
        cluster.label(NODE, {"nodeagent.io/sharing.config": "nope"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
        reason = cluster.annotations(NODE)["nodeagent.io/sharing.config.reason"]
        assert reason.startswith("resolve: ") and "'nope'" in reason
        ok, why = agent.ready()
        assert not ok and "no config named 'nope'" in why
    finally:
        agent.stop()
