"""The node label `nvidia.com/device-plugin.config` chooses which of the device plugin's named
configs (a mounted ConfigMap) the labels follow; a change of the label re-labels the node, a
bad config keeps the labels last published and says why."""

from __future__ import annotations

from pathlib import Path

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cluster import Cluster

NODE = "gpu-node-7"
LABEL = "nvidia.com/device-plugin.config"
TIME_SLICED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n"
)
MPS = "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - {name: gpu, replicas: 3}\n"
BAD = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 1}\n"


def test_the_label_chooses_the_plugin_config(cluster: Cluster, tmp_path: Path) -> None:
    configs = tmp_path / "available-configs"
    configs.mkdir()
    for name, text in (
        ("default", "version: v1\n"),
        ("ts", TIME_SLICED),
        ("mps", MPS),
        ("bad", BAD),
    ):
        (configs / name).write_text(text)
    cluster.add_node(NODE, {"team": "ml"})
    lib = SimulatedNvml(parse_spec("h200x2"))
    agent = make_agent(
        NvmlSession(lib),
        lib.reset,
        labels={"device_plugin_config_dir": configs},
        reconcile={"interval_seconds": 300},
        kube={
            "enabled": True, "node_name": NODE, "host": cluster.url,
            "watch_timeout_seconds": 1, "pod_resources_socket": None,
        },
    )  # fmt: skip

    def gpu_labels() -> tuple[str | None, ...]:
        labels = cluster.labels(NODE)
        keys = ("gpu.replicas", "gpu.sharing-strategy", "gpu.product", "mps.capable")
        return tuple(labels.get("nvidia.com/" + k) for k in keys)

    agent.start()
    try:  # no label: the `named` fallback, the config called default (no sharing)
        cluster.wait(lambda: gpu_labels() == ("1", "none", "NVIDIA-H200", "false"), what="default")
        cluster.label(NODE, {LABEL: "ts"})
        want = ("4", "time-slicing", "NVIDIA-H200-SHARED", "false")
        cluster.wait(lambda: gpu_labels() == want, what="time-slicing")
        cluster.label(NODE, {LABEL: "mps"})
        cluster.wait(lambda: gpu_labels() == ("3", "mps", "NVIDIA-H200", "true"), what="mps")
        cluster.label(NODE, {LABEL: "bad"})
        cluster.wait(lambda: not agent.ready()[0], what="a failed publish")
        _, why = agent.ready()
        assert f"{configs / 'bad'}:5:" in why and "replicas must be a number >= 2" in why
        assert gpu_labels() == ("3", "mps", "NVIDIA-H200", "true")  # the last good labels
    finally:
        agent.stop()
