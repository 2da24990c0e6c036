"""`sharing apply` and `labels -f/-c` on a node NVIDIA's device plugin serves (a plugin config
written, or MPS in the plugin's layout): a per-GPU sharing the plugin cannot serve is one
sentence and exit 2, nothing changed; the same config on bare metal is taken."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result

FILE = """version: nodeagent/v1
sharing-configs:
  split:
    - devices: [0]
      time-slicing: {replicas: 4}
    - devices: [1]
      whole: {}
  mps-split:
    - devices: [0]
      mps: {replicas: 2}
    - devices: [1]
      whole: {}
"""
TOLD = (
    "nodeagent: NVIDIA's device plugin shares every GPU it advertises as nvidia.com/gpu the same"
    " way (its config's devices list is ignored), so it cannot serve GPU 0 {}; GPU 1 whole: give"
    " those GPUs one sharing, or make the ones to keep apart MIG"
)
SERVED_BY_PLUGIN = {  # how the plugin serves the node -> (environment, config, refusal)
    "plugin-config-out": (
        {"NODEAGENT_SHARING_PLUGIN_CONFIG_OUT": "dp.yaml"},
        "split",
        TOLD.format("time-slicing x4"),
    ),
    "mps-layout": ({"NODEAGENT_MPS_LAYOUT": "device-plugin"}, "mps-split", TOLD.format("mps x2")),
}


def _node(tmp_path: Path) -> list[str]:
    (tmp_path / "s.yaml").write_text(FILE)
    return ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]


@pytest.mark.parametrize("served", sorted(SERVED_BY_PLUGIN))
@pytest.mark.parametrize("command", [("sharing", "apply"), ("sharing", "assert"), ("labels",)])
def test_refused_in_one_sentence_with_exit_2(
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
    served: str,
    command: tuple[str, ...],
) -> None:
    env, name, told = SERVED_BY_PLUGIN[served]
    env = {**env, "NODEAGENT_MPS_CONTROL": fake_mps_control}
    got = cli(*_node(tmp_path), *command, "-f", "s.yaml", "-c", name, env=env)
    assert (got.returncode, got.stderr.strip()) == (2, told)
    assert got.stdout == ""
    assert not (tmp_path / "dp.yaml").exists()


def test_time_slicing_alone_is_not_the_mps_layouts_business(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """MPS in the plugin's layout binds only MPS: with no plugin config written, per-GPU
    time-slicing is nodeagent's own (labels) and is taken."""
    env = {"NODEAGENT_MPS_LAYOUT": "device-plugin"}
    got = cli(*_node(tmp_path), "sharing", "apply", "-f", "s.yaml", "-c", "split", env=env)
    assert got.returncode == 0, got.stderr


def test_bare_metal_takes_it(cli: Callable[..., Result], tmp_path: Path) -> None:
    applied = cli(*_node(tmp_path), "sharing", "apply", "-f", "s.yaml", "-c", "split")
    assert applied.returncode == 0, applied.stderr
    labels = cli(*_node(tmp_path), "labels", "-f", "s.yaml", "-c", "split")
    assert labels.returncode == 0, labels.stderr
    lines = set(labels.stdout.splitlines())
    assert {"nodeagent.io/gpu.0.sharing=time-slicing", "nvidia.com/gpu.replicas=1"} <= lines


def test_mps_for_the_plugin_needs_its_layout(cli: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "mps.yaml").write_text(
        "version: nodeagent/v1\nsharing-configs:\n  m:\n    - {devices: all, mps: {replicas: 2}}\n"
    )
    env = {"NODEAGENT_SHARING_PLUGIN_CONFIG_OUT": "dp.yaml", "NODEAGENT_MPS_LAYOUT": "flat"}
    got = cli(*_node(tmp_path), "sharing", "apply", "-f", "mps.yaml", "-c", "m", env=env)
    assert got.returncode == 2
    assert got.stderr.strip().endswith(
        "but mps.layout is 'flat' here: set mps.layout to device-plugin"
    )
