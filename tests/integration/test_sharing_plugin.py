"""Per-GPU sharing where NVIDIA's device plugin serves the node (sharing.plugin-config-out set), on
an emulated 4xH200 node with the fake MPS daemon. The plugin shares every `nvidia.com/gpu`
device one way (k8s-device-plugin 1b826ac ignores a resource's `devices` list and refuses MPS
beside MIG devices), so: what it can serve is written exactly, with the labels saying the same;
what it cannot is refused in the plan step, before anything changed, and reported (readyz),
with the last file left as it was."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.agent.service import Agent
from nodeagent.nvml import read_inventory
from tests.support.sharing import sharing_node

BALANCED = '{"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}'


def _config(*entries: str) -> str:
    return "".join(f"    - {entry}\n" for entry in entries)


CONFIGS = {
    "sliced": _config("{devices: all, time-slicing: {replicas: 4}}"),
    "mps": _config("{devices: all, mps: {replicas: 4}}"),
    "mig-and-sliced": _config(
        f"{{devices: [0, 1], mig: {{mig-devices: {BALANCED}}}}}",
        "{devices: [2, 3], time-slicing: {replicas: 2}}",
    ),
    "whole": _config("{devices: all, whole: {}}"),
    # What the plugin cannot serve:
    "sliced-and-whole": _config(
        "{devices: [0, 1], time-slicing: {replicas: 4}}", "{devices: [2, 3], whole: {}}"
    ),
    "sliced-2-and-4": _config(
        "{devices: [0, 1], time-slicing: {replicas: 4}}",
        "{devices: [2, 3], time-slicing: {replicas: 2}}",
    ),
    "mps-and-sliced": _config(
        "{devices: [0, 1], mps: {replicas: 4}}", "{devices: [2, 3], time-slicing: {replicas: 4}}"
    ),
    "mps-and-whole": _config(
        "{devices: [0, 1], mps: {replicas: 4}}", "{devices: [2, 3], whole: {}}"
    ),
    "mps-and-mig": _config(
        "{devices: [0, 1], mps: {replicas: 4}}",
        f"{{devices: [2, 3], mig: {{mig-devices: {BALANCED}}}}}",
    ),
}
FILE = "version: nodeagent/v1\nsharing-configs:\n" + "".join(
    f"  {name}:\n{body}" for name, body in CONFIGS.items()
)


def _plugin(strategy: str | None, replicas: int = 0) -> dict[str, Any]:
    sharing = (
        {}
        if strategy is None
        else {strategy: {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}
    )
    strategy_flag = "none" if strategy == "mps" else "mixed"  # the plugin refuses mixed + MPS
    return {"version": "v1", "flags": {"migStrategy": strategy_flag}, "sharing": sharing}


SERVED = {  # config -> (plugin config, gpu.sharing-strategy, gpu.replicas)
    "sliced": (_plugin("timeSlicing", 4), "time-slicing", "4"),
    "mps": (_plugin("mps", 4), "mps", "4"),
    "mig-and-sliced": (_plugin("timeSlicing", 2), "time-slicing", "2"),
    "whole": (_plugin(None), "none", "1"),
}
REFUSED = {
    "sliced-and-whole": "GPUs 0, 1 time-slicing x4; GPUs 2, 3 whole",
    "sliced-2-and-4": "GPUs 0, 1 time-slicing x4; GPUs 2, 3 time-slicing x2",
    "mps-and-sliced": "GPUs 0, 1 mps x4; GPUs 2, 3 time-slicing x4",
    "mps-and-whole": "GPUs 0, 1 mps x4; GPUs 2, 3 whole",
    "mps-and-mig": "GPUs 2, 3 would have MIG while GPUs 0, 1 would be under MPS",
}


@pytest.fixture
def node(tmp_path: Path, fake_mps_control: str) -> Iterator[tuple[Agent, Path]]:
    with sharing_node(
        tmp_path,
        "h200x4",
        FILE,
        fake_mps_control,
        plugin_layout=True,
        sharing={"plugin_config_out": tmp_path / "dp" / "config.yaml"},
        labels={"nfd_features_file": tmp_path / "features"},
    ) as (agent, _lib):
        yield agent, tmp_path


def _run(agent: Agent, name: str) -> Any:
    agent.settings = dataclasses.replace(
        agent.settings, sharing=dataclasses.replace(agent.settings.sharing, config=name)
    )
    return agent.pipeline.run_once()


def _labels(tmp: Path) -> dict[str, str]:
    lines = (tmp / "features").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("name", sorted(SERVED))
def test_what_the_plugin_serves_is_written_exactly(node: tuple[Agent, Path], name: str) -> None:
    agent, tmp = node
    report = _run(agent, name)
    assert report.result == "success", report.reason
    document, strategy, replicas = SERVED[name]
    assert yaml.safe_load((tmp / "dp" / "config.yaml").read_text()) == document
    labels = _labels(tmp)
    assert labels["nvidia.com/gpu.sharing-strategy"] == strategy
    assert labels["nvidia.com/gpu.replicas"] == replicas
    for i, (offer, n) in agent.pipeline.per_gpu.items():
        assert labels[f"nodeagent.io/gpu.{i}.sharing"] == offer
        assert labels[f"nodeagent.io/gpu.{i}.replicas"] == str(n)
    assert agent.ready() == (True, "ok")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_plugin_cannot_serve_is_refused_before_anything_changes(
    node: tuple[Agent, Path], name: str
) -> None:
    agent, tmp = node
    assert _run(agent, "sliced").result == "success"
    written = (tmp / "dp" / "config.yaml").read_text()
    labels = _labels(tmp)
    report = _run(agent, name)
    assert (report.result, report.step) == ("failure", "plan")
    assert REFUSED[name] in (report.reason or "")
    assert report.reason is not None and report.reason.count(". ") == 0  # one sentence
    assert not report.done
    assert not any(g.mig_current for g in read_inventory(agent.session).gpus)
    assert agent.mps.daemon is None
    assert (tmp / "dp" / "config.yaml").read_text() == written
    assert _labels(tmp) == labels
    ready, why = agent.ready()
    assert not ready and REFUSED[name] in why


def test_without_the_plugin_each_gpu_keeps_its_own_sharing(node: tuple[Agent, Path]) -> None:
    """Bare metal (no plugin config written, flat MPS layout): the per-GPU sharing is taken,
    and GFD's node-wide labels claim no sharing the GPUs do not all have."""
    agent, tmp = node
    agent.settings = dataclasses.replace(
        agent.settings,
        sharing=dataclasses.replace(agent.settings.sharing, plugin_config_out=None),
        mps=dataclasses.replace(agent.settings.mps, layout="flat"),
    )
    assert _run(agent, "sliced-and-whole").result == "success"
    labels = _labels(tmp)
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.replicas"] == "1"
    assert labels["nodeagent.io/gpu.0.sharing"] == "time-slicing"
    assert labels["nodeagent.io/gpu.2.sharing"] == "whole"
    assert not (tmp / "dp" / "config.yaml").exists()
