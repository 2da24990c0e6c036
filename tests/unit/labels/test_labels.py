"""Node labels for known layouts on every emulated model (golden files), and the usage annotation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeagent.labels.gfd import GfdOptions
from nodeagent.labels.nfd import render_features, write_features
from nodeagent.labels.render import SharingState, render_labels, slice_usage
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.mig_apply import reconfigure

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def _inventory(spec: str, config: str | None) -> tuple[Inventory, SimulatedNvml, NvmlSession]:
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "g")
        reconfigure(session, cfg, config, lib.reset)
    return read_inventory(session), lib, session


# The models whose goldens are kept (a model added to the emulator gets the GFD regex test in
# test_gfd_expected_output.py at once, and a golden file when someone adds it here).
GOLDEN_SPECS = (
    "h200",
    "a100-40gb",
    "a100-80gb",
    "h100-80gb",
    "a30",
    "a100-40gb,h100-80gb",
    "b200",
    "gh200-144gb",
    "rtx-pro-6000",
)
SINGLE_PROFILE = {
    "b200": "all-1g.23gb",
    "gh200-144gb": "all-1g.18gb",
    "rtx-pro-6000": "all-1g.24gb",
    "h200": "all-1g.18gb",
    "a100-40gb": "all-1g.5gb",
    "a100-80gb": "all-1g.10gb",
    "h100-80gb": "all-1g.10gb",
    "a30": "all-1g.6gb",
    "a100-40gb,h100-80gb": "all-1g.10gb",
}
MACHINE = "PowerEdge XE9680\n"
CASES = (
    [(spec, None, "mixed") for spec in GOLDEN_SPECS]
    + [(spec, "all-balanced", s) for spec in GOLDEN_SPECS for s in ("none", "single", "mixed")]
    + [(spec, SINGLE_PROFILE[spec], "single") for spec in GOLDEN_SPECS]
    + [("h200x2", "all-1g.18gb.me", s) for s in ("single", "mixed")]
)


def _golden_name(spec: str, config: str | None, strategy: str) -> str:
    return f"labels-{spec.replace(',', '+')}-{config or 'mig-off'}-{strategy}.json"


@pytest.mark.parametrize(
    ("spec", "config", "strategy"), CASES, ids=[_golden_name(*c)[7:-5] for c in CASES]
)
def test_golden_labels(spec: str, config: str | None, strategy: str) -> None:
    inventory, _, _ = _inventory(spec, config)
    got = render_labels(inventory, gfd=GfdOptions(strategy, MACHINE))
    path = GOLDEN / _golden_name(spec, config, strategy)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(path.read_text())


def test_gfd_names_and_values_on_h200() -> None:
    inventory, _, _ = _inventory("h200x2", "all-balanced")
    labels = render_labels(inventory)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.18gb.count"] == "4"  # 2 per GPU
    assert labels["nvidia.com/mig-3g.71gb.memory"] == "71424"
    assert labels["nvidia.com/mig-3g.71gb.multiprocessors"] == "60"
    assert labels["nvidia.com/mig-3g.71gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-2g.35gb.engines.copy"] == "2"
    assert labels["nvidia.com/mps.capable"] == "false"  # every GPU is in MIG mode


def test_plus_me_becomes_dot_me() -> None:
    inventory, _, _ = _inventory("h200", "all-1g.18gb.me")
    labels = render_labels(inventory)
    assert labels["nvidia.com/mig-1g.18gb.me.count"] == "1"
    assert labels["nvidia.com/mig-1g.18gb.me.engines.ofa"] == "1"


def test_prefix_and_sharing() -> None:
    inventory, _, _ = _inventory("a100-40gb", None)
    labels = render_labels(inventory, SharingState("mps", 4), prefix="nodeagent.io/")
    assert labels["nodeagent.io/gpu.sharing-strategy"] == "mps"
    assert labels["nodeagent.io/gpu.replicas"] == "4"
    assert labels["nodeagent.io/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"  # GFD's suffix
    assert all(k.startswith("nodeagent.io/") for k in labels)


def test_labels_follow_the_geometry() -> None:
    inventory, lib, session = _inventory("h200", "all-balanced")
    before = render_labels(inventory)
    cfg = parse_config(dump_config(generate_configs(inventory)), "g")
    reconfigure(session, cfg, "all-7g.141gb", lib.reset)
    after = render_labels(read_inventory(session))
    assert "nvidia.com/mig-7g.141gb.count" in after
    assert not any(k.startswith("nvidia.com/mig-1g") for k in after)
    assert any(k.startswith("nvidia.com/mig-1g") for k in before)


def test_usage_annotation_counts_free_and_used() -> None:
    inventory, lib, session = _inventory("h200", "all-balanced")
    one = next(s for s in inventory.gpus[0].slices if s.profile == "1g.18gb")
    assert one.mig_uuid
    lib.attach(one.mig_uuid, 42, 1 << 20)
    three = next(s for s in inventory.gpus[0].slices if s.profile == "3g.71gb")
    usage = json.loads(
        slice_usage(read_inventory(session), {three.mig_uuid or "": "pod default/asr"})
    )
    assert usage == {
        "1g.18gb": {"free": 1, "used": 1},
        "2g.35gb": {"free": 1, "used": 0},
        "3g.71gb": {"free": 0, "used": 1},
    }


def test_nfd_file_is_written_atomically_and_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "nodeagent"
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-H200"}
    assert write_features(path, labels)
    assert path.read_text() == "nvidia.com/gpu.count=1\nnvidia.com/gpu.product=NVIDIA-H200\n"
    assert not write_features(path, labels)
    assert render_features({}) == ""
    assert [p.name for p in path.parent.iterdir()] == ["nodeagent"]
