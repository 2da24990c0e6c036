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
    text = (ROOT / "docs" / "gpu-operator.md").read_text()
    start = text.index("## Beside the GPU operator, step by step")
    return text[start : text.index("\n## ", start + 1)]


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


SHIPPED = ROOT / "daemonset/overlays/with-gpu-operator/default-mig-parted-config.yaml"
UPSTREAM_CONFIGMAP = OPERATOR / "assets/state-mig-manager/0400_configmap.yaml"


def _header_and_body() -> tuple[list[str], str]:
    lines = SHIPPED.read_text().splitlines(keepends=True)
    header = [line for line in lines if line.startswith("#")]
    return header, "".join(lines[len(header) :])


def test_the_overlay_ships_the_operators_default_configmap_whole() -> None:
    header, body = _header_and_body()
    assert body == UPSTREAM_CONFIGMAP.read_text()  # byte for byte below the header
    # The header names where it comes from, as tests/fixtures/upstream/README.md does.
    row = next(
        line
        for line in (ROOT / "tests/fixtures/upstream/README.md").read_text().splitlines()
        if "state-mig-manager/0400_configmap.yaml" in line
    )
    commit = row.split("|")[-2].strip()
    named = {k.strip("# ").strip(): v.strip() for k, _, v in (h.partition(":") for h in header)}
    assert named["repository"] == "NVIDIA/gpu-operator"
    assert named["path"] == "assets/state-mig-manager/0400_configmap.yaml"
    assert named["commit"] == commit and len(commit) == 40


def _rendered() -> tuple[dict[str, Any], ...]:
    from tests.deploy.test_kustomize import render

    return render("overlays/with-gpu-operator")


def test_the_agent_reads_the_shipped_configmap_and_refreshes_cdi() -> None:
    from nodeagent.cli.commands import build_parser
    from nodeagent.settings import load

    docs = _rendered()
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["metadata"] == {"name": "default-mig-parted-config", "namespace": "nodeagent"}
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {**env, "NODE_NAME": "n"}, None, args.groups)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (item,) = volumes["config"]["configMap"]["items"]
    assert volumes["config"]["configMap"]["name"] == "default-mig-parted-config"
    assert settings.mig.config_file == f"{mounts['config']}/{item['path']}"
    assert item["key"] == "config.yaml" and item["key"] in cm["data"]
    # CDI on (the operator's default), reboots off (its WITH_REBOOT default), host root at /host
    values = _chart_values()
    assert settings.mig.cdi_refresh is values["cdi"]["enabled"] is True
    assert not settings.mig.with_reboot and settings.mig.reboot_command == "chroot /host reboot"
    assert mounts["host-root"] == "/host" and volumes["host-root"]["hostPath"]["path"] == "/"
    generate = settings.mig.cdi_commands[-1]
    assert generate.startswith("chroot /host ") and "cdi generate --mode=management" in generate
    assert "--output=/var/run/cdi/management.nvidia.com-gpu.yaml" in generate


def test_every_config_plans_on_the_emulated_models_its_device_filters_name() -> None:
    from nodeagent.mig.config import parse_config
    from nodeagent.sim.models import MODEL_NAMES, load_model
    from tests.integration.mig.test_upstream_configs import outcome

    (cm,) = [d for d in _rendered() if d["kind"] == "ConfigMap"]
    text = cm["data"]["config.yaml"]
    cfg = parse_config(text, "default-mig-parted-config")
    by_id: dict[int, list[str]] = {}
    for model in MODEL_NAMES:
        by_id.setdefault(load_model(model).pci_device_id, []).append(model)
    checked = 0
    for name, entries in yaml.safe_load(text)["mig-configs"].items():
        for entry in entries:
            filters = entry.get("device-filter", [])
            for device in [filters] if isinstance(filters, str) else filters:
                for model in by_id.get(int(device, 16), []):
                    assert outcome(cfg, name, model) == "planned", (name, device, model)
                    checked += 1
    assert checked >= 30, checked  # every all-balanced entry on the models it names
