"""The GPU operator's MIG models: they load, their geometry is consistent, every value has a
source, and every config of the operator's default MIG ConfigMap fits the models it targets.

The ConfigMap is NVIDIA/gpu-operator assets/state-mig-manager/0400_configmap.yaml at
a22dbf671f2e26f9a1e342f8eea28e196235e110 (tests/fixtures/upstream/README.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.sim.models import MODEL_NAMES, DeviceModel, ProfileModel, load_model, parse_spec

REPO = Path(__file__).resolve().parents[3]
OPERATOR_JSON = REPO / "nodeagent" / "sim" / "models" / "operator-models.json"
CONFIGMAP = (
    REPO / "tests/fixtures/upstream/gpu-operator/assets/state-mig-manager/0400_configmap.yaml"
)
RAW = json.loads(OPERATOR_JSON.read_text())["models"]
OPERATOR_KEYS = sorted(RAW)
# Profile names of the pre-production GB200 board (gpu-operator 748827774, PR #1303); the
# ConfigMap keeps their all-* configs, but production GB200s list 3g.93gb/4g.93gb/7g.186gb
# (mig-parted issue #227, fix ebab1f77), which the gb200 model follows.
PRE_PRODUCTION_GB200 = {"all-3g.95gb", "all-4g.95gb", "all-7g.189gb"}


def _configs() -> dict[str, list[dict[str, Any]]]:
    data = yaml.safe_load(CONFIGMAP.read_text())
    configs: dict[str, list[dict[str, Any]]] = yaml.safe_load(data["data"]["config.yaml"])[
        "mig-configs"
    ]
    return configs


def _short(p: ProfileModel) -> str:
    return p.name.removeprefix("MIG ")


def _by_pci() -> dict[int, DeviceModel]:
    return {load_model(k).pci_device_id: load_model(k) for k in MODEL_NAMES}


def _fits(model: DeviceModel, wanted: list[ProfileModel], placed: list[tuple[int, int]]) -> bool:
    """Can all of `wanted` be placed without overlap, in the compute slices, one +me at most?"""
    if not wanted:
        return True
    p, rest = wanted[0], wanted[1:]
    for start, size in p.placements:
        free = all(start + size <= s or s + n <= start for s, n in placed)
        if free and _fits(model, rest, [*placed, (start, size)]):
            return True
    return False


def _layout_fits(model: DeviceModel, devices: dict[str, int]) -> bool:
    by_name = {_short(p): p for p in model.profiles}
    wanted = sorted(
        (by_name[name] for name, n in devices.items() for _ in range(n)),
        key=lambda p: -p.placements[0][1],
    )
    if sum(p.slice_count for p in wanted) > model.compute_slices:
        return False
    if sum(_short(p).endswith("+me") for p in wanted) > 1:
        return False
    return all(sum(q.id == p.id for q in wanted) <= p.instance_count for p in wanted) and _fits(
        model, wanted, []
    )


@pytest.mark.parametrize("key", OPERATOR_KEYS)
def test_every_operator_model_loads_and_is_a_simulate_name(key: str) -> None:
    model = load_model(key)
    assert key in MODEL_NAMES and parse_spec(f"{key}x2") == [key, key]
    assert model.profiles and model.name.startswith("NVIDIA ")
    assert len({p.id for p in model.profiles}) == len(model.profiles)
    assert len({p.constant for p in model.profiles}) == len(model.profiles)
    assert len({p.name for p in model.profiles}) == len(model.profiles)


@pytest.mark.parametrize("key", MODEL_NAMES)
def test_placements_are_consistent(key: str) -> None:
    model = load_model(key)
    for p in model.profiles:
        assert p.placements, p.name
        sizes = {n for _, n in p.placements}
        assert len(sizes) == 1, p.name
        assert all(s >= 0 and s + n <= model.memory_slices for s, n in p.placements), p.name
        assert p.slice_count <= model.compute_slices, p.name
        # the instance count is achievable: that many instances fit side by side
        assert _fits(model, [p] * p.instance_count, []), p.name
        assert p.memory_size_mb * 2**20 <= model.memory_total_bytes, p.name
    whole = [p for p in model.profiles if p.placements == ((0, model.memory_slices),)]
    assert whole and max(p.multiprocessor_count for p in whole) == max(
        p.multiprocessor_count for p in model.profiles
    )


def _all_sources(key: str) -> Iterator[tuple[str, Any]]:
    raw = RAW[key]
    yield "device_sources", raw["device_sources"]
    if "gpu_instance_profiles_same_as" in raw:
        yield "profiles_basis", raw["profiles_basis"]
        return
    for p in raw["gpu_instance_profiles"]:
        yield p["name"], p["sources"]


@pytest.mark.parametrize("key", OPERATOR_KEYS)
def test_every_value_has_a_source(key: str) -> None:
    raw = RAW[key]
    for field in ("name", "pci_device_id", "memory_total_mib"):
        assert raw["device_sources"].get(field), (key, field)
    for what, sources in _all_sources(key):
        assert sources, (key, what)
    if "gpu_instance_profiles_same_as" in raw:
        assert raw["gpu_instance_profiles_same_as"] in MODEL_NAMES
    for p in raw.get("gpu_instance_profiles", []):
        # memory in MiB agrees with the GiB that nvidia-smi prints
        assert f"{p['memorySizeMB'] / 1024:.2f}" == f"{p['memory_gib']:.2f}", (key, p["name"])


def test_rtx_pro_6000_has_its_attribute_profiles() -> None:
    import pynvml

    model = load_model("rtx-pro-6000")
    constants = {_short(p): p.constant for p in model.profiles}
    assert constants["1g.24gb+gfx"] == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
    assert constants["1g.24gb+me.all"] == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
    assert constants["1g.24gb-me"] == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
    assert constants["2g.48gb+gfx"] == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
    assert constants["2g.48gb+me.all"] == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME
    assert constants["2g.48gb-me"] == pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME
    assert constants["4g.96gb+gfx"] == pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX
    assert model.memory_slices == 12 and model.compute_slices == 4


def _filtered_entries() -> Iterator[tuple[str, int, dict[str, Any]]]:
    for name, entries in _configs().items():
        for i, entry in enumerate(entries):
            if "device-filter" in entry and entry.get("mig-devices"):
                yield name, i, entry


@pytest.mark.parametrize(
    ("config", "index", "entry"),
    [pytest.param(*e, id=f"{e[0]}[{e[1]}]") for e in _filtered_entries()],
)
def test_configmap_filtered_entries_fit_the_models_they_name(
    config: str, index: int, entry: dict[str, Any]
) -> None:
    ids = entry["device-filter"]
    ids = [ids] if isinstance(ids, str) else ids
    models = [m for pci, m in _by_pci().items() if pci in {int(i, 16) for i in ids}]
    assert models, f"{config}: no emulated model for {ids}"
    for model in models:
        names = {_short(p) for p in model.profiles}
        missing = set(entry["mig-devices"]) - names
        assert not missing, (config, model.key, missing)
        assert _layout_fits(model, entry["mig-devices"]), (config, model.key)


def test_every_configmap_profile_is_on_some_model() -> None:
    models = [load_model(k) for k in MODEL_NAMES]
    orphans = set()
    for name, entries in _configs().items():
        for entry in entries:
            wanted = set(entry.get("mig-devices") or {})
            if wanted and not any(wanted <= {_short(p) for p in m.profiles} for m in models):
                orphans.add(name)
    assert orphans == PRE_PRODUCTION_GB200


def test_configmap_device_ids_are_all_modelled_or_known_absent() -> None:
    seen = set()
    for _, _, entry in _filtered_entries():
        ids = entry["device-filter"]
        seen |= {int(i, 16) for i in ([ids] if isinstance(ids, str) else ids)}
    absent = seen - set(_by_pci())
    # documented in operator-models.json notes: no capture or unsourced part
    assert absent == {0x20F110DE, 0x20B610DE, 0x233B10DE}
