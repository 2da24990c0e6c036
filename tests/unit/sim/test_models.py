"""The emulator's device models equal the captures they were built from, field by field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nodeagent.base.errors import SimError
from nodeagent.sim.models import (
    MAX_GPUS,
    MIB,
    MODEL_NAMES,
    infer_constant,
    load_model,
    parse_spec,
)
from nodeagent.sim.state import fresh_state

PROFILE_FIELDS = {
    "id": "id",
    "sliceCount": "slice_count",
    "instanceCount": "instance_count",
    "multiprocessorCount": "multiprocessor_count",
    "copyEngineCount": "copy_engine_count",
    "decoderCount": "decoder_count",
    "encoderCount": "encoder_count",
    "jpegCount": "jpeg_count",
    "ofaCount": "ofa_count",
    "memorySizeMB": "memory_size_mb",
    "isP2pSupported": "is_p2p_supported",
}


def test_h200_model_equals_real_capture(shared_fixtures: Path) -> None:
    raw = json.loads((shared_fixtures / "nvml" / "h200-sxm-141gb.json").read_text())
    model = load_model("h200")
    dev = raw["device"]
    assert model.name == dev["name"]
    assert model.pci_device_id == int(dev["pci_device_id"], 16)
    assert model.architecture == dev["architecture"]
    assert list(model.compute_capability) == dev["cuda_compute_capability"]
    assert model.memory_total_bytes == dev["memory_total_bytes"]
    assert model.memory_reserved_bytes == dev["memory_reserved_bytes"]
    assert model.driver_version == raw["driver_version"]
    assert model.cuda_driver_version == raw["cuda_driver_version"]
    assert len(model.profiles) == len(raw["gpu_instance_profiles"]) == 7
    for want, got in zip(raw["gpu_instance_profiles"], model.profiles, strict=True):
        assert got.name == want["name"]
        for key, attr in PROFILE_FIELDS.items():
            assert getattr(got, attr) == want[key], (want["name"], key)
        assert [list(p) for p in got.placements] == want["placements"]


def test_package_data_is_the_fixture_unchanged(shared_fixtures: Path) -> None:
    models = Path(__file__).resolve().parents[3] / "nodeagent" / "sim" / "models"
    for name in ("h200-sxm-141gb.json", "mig-user-guide-models.json"):
        assert (models / name).read_bytes() == (shared_fixtures / "nvml" / name).read_bytes()


@pytest.mark.parametrize(
    ("key", "raw_key"),
    [
        ("a100-40gb", "a100-40gb"),
        ("a100-80gb", "a100-80gb"),
        ("h100-80gb", "h100-80gb"),
        ("a30", "a30-24gb"),
    ],
)
def test_user_guide_models_equal_their_tables(
    shared_fixtures: Path, key: str, raw_key: str
) -> None:
    raw = json.loads((shared_fixtures / "nvml" / "mig-user-guide-models.json").read_text())
    want_model = raw["models"][raw_key]
    model = load_model(key)
    assert model.name == want_model["name"]
    assert model.pci_device_id == int(want_model["pci_device_id"], 16)
    assert model.memory_total_bytes == want_model["memory_total_mib"] * MIB
    assert model.memory_slices == want_model["memory_slices"]
    for want, got in zip(want_model["gpu_instance_profiles"], model.profiles, strict=True):
        assert got.name == "MIG " + want["name"]
        for k, attr in PROFILE_FIELDS.items():
            assert getattr(got, attr) == want[k], (want["name"], k)
        assert [list(p) for p in got.placements] == want["placements"]


def test_inferred_constants_reproduce_the_real_h200(shared_fixtures: Path) -> None:
    import pynvml

    raw = json.loads((shared_fixtures / "nvml" / "h200-sxm-141gb.json").read_text())
    for p in raw["gpu_instance_profiles"]:
        assert infer_constant(p) == getattr(pynvml, p["constant"]), p["name"]


@pytest.mark.parametrize(
    ("spec", "keys"),
    [
        ("h200", ["h200"]),
        ("h200x2", ["h200", "h200"]),
        ("H200X2", ["h200", "h200"]),
        ("a100-40gbx2,h100-80gb", ["a100-40gb", "a100-40gb", "h100-80gb"]),
        ("a30, h200", ["a30", "h200"]),
    ],
)
def test_parse_spec(spec: str, keys: list[str]) -> None:
    assert parse_spec(spec) == keys


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("h200,", "empty"),
        ("v100", "no known GPU model"),
        ("h200x0", "count must be 1..255"),
        ("h200x256", "count must be 1..255"),
        ("h200x200,h200x56", "at most 255"),
        ("h200y2", "no known GPU model"),
    ],
)
def test_parse_spec_refuses_bad_specs(spec: str, words: str) -> None:
    with pytest.raises(SimError, match=words):
        parse_spec(spec)


def test_every_gpu_of_the_largest_node_has_its_own_valid_pci_bus() -> None:
    """The first 16 as on a DGX-style board (as before the cap was lifted); all unique."""
    state = fresh_state(parse_spec(f"h200x{MAX_GPUS}"))
    buses = [gpu.pci_bus_id for gpu in state.gpus]
    assert len(set(buses)) == MAX_GPUS
    assert all(re.fullmatch(r"00000000:(?!00)[0-9A-F]{2}:00\.0", bus) for bus in buses)
    assert buses[:2] + buses[8:10] == [f"00000000:{b}:00.0" for b in ("18", "2A", "19", "2B")]


def test_every_model_loads() -> None:
    for key in MODEL_NAMES:
        model = load_model(key)
        assert model.profiles
        assert all(s + n <= model.memory_slices for p in model.profiles for s, n in p.placements)
