"""`nvidia-mig-parted` on the real GPUs, reading only: export, assert (the GPUs match their
own export, mode and devices), generate-config. Nothing is applied."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.nvml import Inventory
from tests.support.cli import Result

pytestmark = pytest.mark.gpu


def test_export_then_assert_on_the_real_gpus(
    mig_parted: Callable[..., Result], real_inventory: Inventory, tmp_path: Path
) -> None:
    res = mig_parted("export", "-o", "json", "-l", "real")
    assert res.returncode == 0, res.stderr
    entries = json.loads(res.stdout)["mig-configs"]["real"]
    modes = {i: e["mig-enabled"] for e in entries for i in e["devices"]}
    assert modes == {gpu.index: gpu.mig_current for gpu in real_inventory.gpus}
    exported = tmp_path / "real.json"
    exported.write_text(res.stdout)
    for flags in ([], ["--mode-only"], ["--valid-config"]):
        res = mig_parted("assert", "-f", str(exported), "-c", "real", *flags)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("Selected MIG ")


def test_generate_config_on_the_real_gpus(
    mig_parted: Callable[..., Result], real_inventory: Inventory
) -> None:
    res = mig_parted("generate-config", "-o", "json")
    assert res.returncode == 0, res.stderr
    configs = json.loads(res.stdout)["mig-configs"]
    assert "all-disabled" in configs
    assert ("all-balanced" in configs) == any(gpu.mig_capable for gpu in real_inventory.gpus)
