"""Every GPU-operator model through the real CLI and nvml/ code: generate-config, then apply,
assert and export its all-balanced config on the emulator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nodeagent.sim.models import load_model
from tests.support.cli import Result
from tests.unit.sim.test_operator_models import OPERATOR_KEYS

Cli = Callable[..., Result]


@pytest.mark.parametrize("key", OPERATOR_KEYS)
def test_generate_config_and_apply_all_balanced(key: str, cli: Cli, tmp_path: Path) -> None:
    model = load_model(key)
    state = tmp_path / "node.json"

    def run(*args: str) -> Result:
        return cli("--simulate", f"{key}x2", "--sim-state", str(state), *args)

    res = run("mig", "generate-config")
    assert res.returncode == 0, res.stderr
    configs = yaml.safe_load(res.stdout)["mig-configs"]
    named = {
        name for entries in configs.values() for e in entries for name in e.get("mig-devices", {})
    }
    assert named == {p.name.removeprefix("MIG ") for p in model.profiles}
    (balanced,) = configs["all-balanced"]
    assert balanced["device-filter"] == f"0x{model.pci_device_id:08X}"
    path = tmp_path / "balanced.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {"all-balanced": [balanced]}}))
    res = run("mig", "apply", "-f", str(path), "-c", "all-balanced", "-o", "json")
    assert res.returncode == 0, res.stderr
    creates = [op for op in json.loads(res.stdout)["operations"] if op["op"] == "create-gi"]
    assert len(creates) == 2 * sum(balanced["mig-devices"].values())
    assert run("mig", "assert", "-f", str(path), "-c", "all-balanced").returncode == 0
    export = run("mig", "export")
    assert export.returncode == 0
    exported = yaml.safe_load(export.stdout)["mig-configs"]
    (entry,) = next(iter(exported.values()))
    assert entry["mig-devices"] == balanced["mig-devices"]
