"""The README's Helm values for running beside NVIDIA's GPU operator, checked against the chart's
own values.yaml and the operator's MPS daemon (copies in tests/fixtures/upstream/gpu-operator,
commit in tests/fixtures/upstream/README.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from nodeagent.labels.render import render_labels
from nodeagent.nvml import open_session, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "tests/fixtures/upstream/gpu-operator"
OVERLAY = ROOT / "daemonset/overlays/with-gpu-operator/kustomization.yaml"


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("### Beside the GPU operator, step by step")
    return text[start : text.index("\n### ", start + 1)]


def _chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((OPERATOR / "deployments/gpu-operator/values.yaml").read_text())  # fmt: skip
    return values


def _lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"{dotted}: no such Helm value"
        node = node[part]
    return node


def test_every_helm_value_in_the_readme_is_a_switch_of_the_chart_turned_off() -> None:
    sets = re.findall(r"--set ([\w.]+)=(\w+)", _section())
    assert {k for k, _ in sets} == {"migManager.enabled", "gfd.enabled"}
    values = _chart_values()
    for key, value in sets:
        assert _lookup(values, key) is True and value == "false", key  # on by default: a change
    # The ClusterPolicy patch in the same section says the same.
    patch = re.search(r"-p\s+'(\{.*?\})'", _section(), re.S)
    assert patch is not None
    spec = yaml.safe_load(patch.group(1))["spec"]
    assert {f"{k}.enabled" for k, v in spec.items() if v == {"enabled": False}} == {k for k, _ in sets}  # fmt: skip


def test_the_overlay_matches_the_charts_mig_strategy_and_runtime_class() -> None:
    values = _chart_values()
    overlay = OVERLAY.read_text()
    assert f"value: {{name: NODEAGENT_MIG_STRATEGY, value: {values['mig']['strategy']}}}" in overlay  # fmt: skip
    runtime = (ROOT / "daemonset/components/nvidia-runtime/kustomization.yaml").read_text()
    assert f"value: {values['operator']['runtimeClass']}" in runtime


def test_the_operators_mps_daemon_is_not_scheduled_where_nodeagent_runs_without_mps() -> None:
    """Its DaemonSet selects nvidia.com/mps.capable=true; nodeagent (no MPS in this overlay)
    labels the node false, so the daemon runs nowhere nodeagent labels."""
    daemonset = yaml.safe_load((OPERATOR / "assets/state-mps-control-daemon/0400_daemonset.yaml").read_text())  # fmt: skip
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["nvidia.com/mps.capable"] == "true"
    lib = SimulatedNvml(parse_spec("h200x2"))
    labels = render_labels(read_inventory(open_session(lib)))
    assert labels["nvidia.com/mps.capable"] == "false"
    assert any(labels.get(k) != v for k, v in selector.items())
