"""NVIDIA's real device plugin (built from source: `make device-plugin`, carried in .build/) run
with the config nodeagent writes, on every GPU of the machine, driven by tests/support/fake_kubelet.

For each sharing (every GPU time-sliced x3, under MPS x2, whole) `nodeagent run` applies the
sharing config `devices: all` in the device plugin's MPS layout and writes the plugin's config
(sharing.plugin-config-out) and its labels (an NFD features file). The unmodified plugin is then
started on that file: its ListAndWatch devices, grouped by GPU UUID, must be exactly what the
labels say (nodeagent.io/gpu.<i>.replicas per GPU, GFD's gpu.replicas and gpu.sharing-strategy
for nvidia.com/gpu), and Allocate of one device of each GPU must hand out that GPU (and, under
MPS, the daemon's pipe). Nothing on the GPUs changes: MIG stays off (the test skips on a GPU
with MIG on), EXCLUSIVE_PROCESS stays off; everything made for the run is removed after it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.nvml import Inventory
from tests.gpu.test_device_plugin_real import (
    PLUGIN_DIR,
    RESOURCE,
    _wait,
    needs_plugin,
    staged,
    start_agent,
    start_plugin,
)
from tests.support.fake_kubelet.kubelet import FakeKubelet

pytestmark = pytest.mark.gpu
CASES = {  # name -> (the sharing entry, GFD's gpu.sharing-strategy, replicas per GPU)
    "time-slicing": ("time-slicing: {replicas: 3}", "time-slicing", 3),
    "mps": ("mps: {replicas: 2}", "mps", 2),
    "whole": ("whole: {}", "none", 1),
}


@pytest.fixture
def work(real_inventory: Inventory) -> Iterator[Path]:
    needs_plugin()
    if any(g.mig_current or g.mig_pending for g in real_inventory.gpus):
        pytest.skip("a GPU has MIG on; this test never changes MIG mode")
    with staged() as folder:
        yield folder


def _labels(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def _agent_env(work: Path, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(
        NODEAGENT_SHARING_CONFIG_FILE=str(work / "sharing.yaml"), NODEAGENT_SHARING_CONFIG=name,
        NODEAGENT_SHARING_PLUGIN_CONFIG_OUT=str(work / "dp.yaml"),
        NODEAGENT_NFD_FEATURES_FILE=str(work / "features"),
        NODEAGENT_MPS_LAYOUT="device-plugin", NODEAGENT_MPS_ROOT=str(work / "mps"),
        NODEAGENT_MPS_EXCLUSIVE_PROCESS="false", NODEAGENT_MPS_STOP_ON_EXIT="true",
        NODEAGENT_METRICS_ADDRESS="127.0.0.1:0", NODEAGENT_LOG_LEVEL="info",
    )  # fmt: skip
    return env


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_real_plugin_advertises_what_nodeagent_says(
    work: Path, real_inventory: Inventory, name: str
) -> None:
    entry, strategy, replicas = CASES[name]
    (work / "sharing.yaml").write_text(
        f"version: nodeagent/v1\nsharing-configs:\n  {name}:\n    - devices: all\n      {entry}\n"
    )
    root = work / "mps"
    env = _agent_env(work, name)
    agent = start_agent(work, root, env)
    plugin = None
    try:
        _wait(
            lambda: agent.poll() is not None
            or ((work / "dp.yaml").exists() and (work / "features").exists()
                and (name != "mps" or (root / ".ready").exists())),
            "nodeagent wrote the plugin's config and the labels",
        )  # fmt: skip
        assert agent.poll() is None, (work / "agent.log").read_text()[-3000:]
        written = yaml.safe_load((work / "dp.yaml").read_text())
        print("plugin config:", written)
        labels = _labels(work / "features")
        gpus = {g.uuid: g.index for g in real_inventory.gpus}
        assert labels["nvidia.com/gpu.sharing-strategy"] == strategy
        assert labels["nvidia.com/gpu.replicas"] == str(replicas)
        for index in gpus.values():
            assert labels[f"nodeagent.io/gpu.{index}.replicas"] == str(replicas)
        with FakeKubelet(PLUGIN_DIR) as kubelet:
            plugin = start_plugin(work, work / "dp.yaml", root, kubelet, env)
            kubelet.wait_for_registration(90, RESOURCE)
            session = kubelet.drive(RESOURCE, 0, 60)
            per_gpu: dict[str, list[str]] = {}
            for device in session.devices:
                assert device.health == "Healthy"
                per_gpu.setdefault(device.id.split("::")[0], []).append(device.id)
            print("ListAndWatch:", {gpus[u]: len(ids) for u, ids in per_gpu.items()})
            assert set(per_gpu) == set(gpus)  # every GPU, each under its own UUID
            for uuid, ids in per_gpu.items():
                want = int(labels[f"nodeagent.io/gpu.{gpus[uuid]}.replicas"])
                # Replicas are <uuid>::<k>; an unshared GPU is its UUID alone.
                expected = [uuid] if want == 1 else [f"{uuid}::{k}" for k in range(want)]
                assert sorted(ids) == expected, uuid
                allocation = kubelet.allocate(RESOURCE, [ids[0]], 60)
                print("Allocate", ids[0], "->", allocation.envs)
                assert allocation.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
                pipe = allocation.envs.get("CUDA_MPS_PIPE_DIRECTORY")
                assert pipe == (f"/mps/{RESOURCE}/pipe" if strategy == "mps" else None)
    finally:
        if plugin is not None:
            plugin.terminate()
            plugin.wait(30)
            print("plugin log tail:", (work / "plugin.log").read_text()[-1500:])
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
