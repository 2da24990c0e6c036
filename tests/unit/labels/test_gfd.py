"""GFD's label rules (k8s-device-plugin internal/lm at 1b826ac), one by one, on emulated nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.labels.gfd import (
    GfdOptions,
    Replication,
    family,
    gfd_labels,
    gpu_mode,
    machine_label,
    mig_device_name,
    version_labels,
)
from nodeagent.labels.machine import gfd_options, read_machine_type
from nodeagent.labels.render import SharingState, render_labels
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.nvml.inventory import MigAttributes
from nodeagent.settings import Labels
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.models import MODEL_NAMES, load_model
from tests.support.mig_apply import reconfigure


def node(spec: str, config: str | None = None, text: str | None = None) -> Inventory:
    """An emulated node, with a generated config (`config`) or a config file (`text`) applied."""
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        source = text or dump_config(generate_configs(read_inventory(session)))
        reconfigure(session, parse_config(source, "test"), config, lib.reset)
    return read_inventory(session)


def labels(
    inv: Inventory, strategy: str = "mixed", rep: Replication | None = None
) -> dict[str, str]:
    return gfd_labels(inv, GfdOptions(strategy, "product-name"), rep or Replication())


# -- versions, family, mode, machine -----------------------------------------------------------


def test_driver_and_runtime_versions() -> None:
    assert version_labels("580.159.04", 13000) == {
        "cuda.driver.major": "580",
        "cuda.driver.minor": "159",
        "cuda.driver.rev": "04",
        "cuda.driver-version.major": "580",
        "cuda.driver-version.minor": "159",
        "cuda.driver-version.revision": "04",
        "cuda.driver-version.full": "580.159.04",
        "cuda.runtime.major": "13",
        "cuda.runtime.minor": "0",
        "cuda.runtime-version.major": "13",
        "cuda.runtime-version.minor": "0",
        "cuda.runtime-version.full": "13.0",
    }


def test_two_part_driver_version_has_an_empty_revision() -> None:
    got = version_labels("550.54", 12040)
    assert got["cuda.driver-version.revision"] == got["cuda.driver.rev"] == ""
    assert got["cuda.driver-version.full"] == "550.54"
    assert got["cuda.runtime-version.full"] == "12.4"


@pytest.mark.parametrize("bad", ["580", "1.2.3.4", ""])
def test_a_driver_version_gfd_refuses_gets_no_driver_labels(bad: str) -> None:
    got = version_labels(bad, 13000)
    assert not any(k.startswith("cuda.driver") for k in got)
    assert got["cuda.runtime.major"] == "13"


def test_emulated_node_carries_the_driver_not_the_cuda_version() -> None:
    got = labels(node("h200"))
    assert got["cuda.driver-version.major"] == "580"
    assert got["cuda.driver-version.full"] == "580.159.04"
    assert got["cuda.runtime-version.full"] == "13.0"


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((7, 0), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((13, 0), "rubin"),
        ((4, 0), "undefined"),
    ],
)
def test_family_from_compute_capability(cc: tuple[int, int], name: str) -> None:
    assert family(*cc) == name


@pytest.mark.parametrize(
    ("classes", "mode"),
    [
        ([0x030200, 0x030200], "compute"),
        ([0x030000], "graphics"),
        ([0x030200, 0x030000], "unknown"),
        ([0x030200, None], "unknown"),
        ([0x068000], "unknown"),
        ([], "unknown"),
    ],
)
def test_gpu_mode_from_pci_classes(classes: list[int | None], mode: str) -> None:
    assert gpu_mode(classes) == mode


def test_gpu_mode_of_an_emulated_node_and_of_graphics_boards() -> None:
    inv = node("h200x2")
    assert labels(inv)["gpu.mode"] == "compute"
    vga = replace(inv, gpus=tuple(replace(g, pci_class=0x030000) for g in inv.gpus))
    assert labels(vga)["gpu.mode"] == "graphics"
    one = replace(inv, gpus=(inv.gpus[0], replace(inv.gpus[1], pci_class=None)))
    assert labels(one)["gpu.mode"] == "unknown"


@pytest.mark.parametrize(
    ("content", "value"),
    [
        ("PowerEdge XE9680\n", "PowerEdge-XE9680"),
        ("  ProLiant  DL380a (Gen11) \n", "ProLiant-DL380a-Gen11"),
        ("DGX_H200/v2", "DGX_H200v2"),  # GFD drops what it does not keep
        (None, "unknown"),
        ("", ""),
        ("Acme Inc.", "Acme-Inc"),  # GFD's 'Acme-Inc.' is no valid label value: trimmed
        ("x" * 80, "x" * 63),
    ],
)
def test_machine_type_sanitised(content: str | None, value: str) -> None:
    assert machine_label(content) == value


def test_machine_type_file_read_or_unknown(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_text("NVIDIA DGX H200\n")
    opts = gfd_options(Labels(mig_strategy="single", machine_type_file=path))
    assert opts == GfdOptions("single", "NVIDIA DGX H200\n")
    assert read_machine_type(tmp_path / "absent") is None
    got = render_labels(node("h200"), gfd=gfd_options(Labels(machine_type_file=tmp_path / "no")))
    assert got["nvidia.com/gpu.machine"] == "unknown"


# -- full GPUs, replicas, sharing --------------------------------------------------------------


def test_whole_gpus_unshared() -> None:
    got = labels(node("a100-40gbx2"))
    assert got["gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert (got["gpu.count"], got["gpu.replicas"], got["gpu.sharing-strategy"]) == (
        "2",
        "1",
        "none",
    )
    assert (got["gpu.family"], got["gpu.compute.major"], got["gpu.memory"]) == (
        "ampere",
        "8",
        "40960",
    )


@pytest.mark.parametrize("strategy", ["mps", "time-slicing"])
def test_replicas_above_one_share_the_product(strategy: str) -> None:
    got = labels(node("h200"), rep=Replication(strategy, 4))
    assert got["gpu.product"] == "NVIDIA-H200-SHARED"
    assert (got["gpu.replicas"], got["gpu.sharing-strategy"]) == ("4", strategy)


def test_one_replica_is_not_sharing() -> None:
    got = labels(node("h200"), rep=Replication("time-slicing", 1))
    assert (got["gpu.product"], got["gpu.replicas"]) == ("NVIDIA-H200", "1")
    assert got["gpu.sharing-strategy"] == "none"


def test_mig_enabled_gpus_have_zero_replicas_and_no_shared_suffix() -> None:
    got = labels(node("h200", "all-balanced"), rep=Replication("mps", 4))
    assert (got["gpu.product"], got["gpu.replicas"]) == ("NVIDIA-H200", "0")
    assert got["gpu.sharing-strategy"] == "none"


@pytest.mark.parametrize(
    ("offers", "replicas", "strategy", "product"),
    [
        (
            {0: ("time-slicing", 4), 1: ("time-slicing", 4)},
            "4",
            "time-slicing",
            "NVIDIA-H200-SHARED",
        ),
        ({0: ("mps", 2), 1: ("mps", 2)}, "2", "mps", "NVIDIA-H200-SHARED"),
        ({0: ("whole", 1), 1: ("whole", 1)}, "1", "none", "NVIDIA-H200"),
        # What the plugin cannot serve (it shares all of nvidia.com/gpu one way) is claimed for
        # none of them: only the per-GPU labels say it.
        ({0: ("time-slicing", 4), 1: ("whole", 1)}, "1", "none", "NVIDIA-H200"),
        ({0: ("mps", 2), 1: ("time-slicing", 4)}, "1", "none", "NVIDIA-H200"),
    ],
)
def test_gfd_sharing_is_what_the_written_plugin_config_says(
    offers: dict[int, tuple[str, int]], replicas: str, strategy: str, product: str
) -> None:
    got = render_labels(node("h200x2"), SharingState(), per_gpu=offers)
    assert got["nvidia.com/gpu.replicas"] == replicas
    assert got["nvidia.com/gpu.sharing-strategy"] == strategy
    assert got["nvidia.com/gpu.product"] == product
    assert got["nodeagent.io/gpu.0.sharing"] == offers[0][0]


def test_mps_capable_only_where_nodeagent_runs_mps() -> None:
    inv = node("h200")
    assert render_labels(inv)["nvidia.com/mps.capable"] == "false"
    assert render_labels(inv, SharingState("mps", 2))["nvidia.com/mps.capable"] == "true"


# -- nodes with two GPU models -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "product", "memory"),
    [
        ("a100-40gb,h100-80gbx2", "NVIDIA-A100-SXM4-40GB", "40960"),
        ("h100-80gb,a100-40gbx2", "NVIDIA-H100-80GB-HBM3", "81559"),
    ],
)
def test_two_models_one_model_labels_with_its_own_count(
    spec: str, product: str, memory: str
) -> None:
    got = labels(node(spec))
    assert (got["gpu.product"], got["gpu.count"], got["gpu.memory"]) == (product, "1", memory)


_HALF = """version: v1
mig-configs:
  half:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"%s": 1}
    - devices: [1]
      mig-enabled: false
"""


def test_a_full_gpu_model_wins_over_a_mig_enabled_one() -> None:
    inv = node("a100-40gb,h100-80gb", "half", _HALF % "7g.40gb")
    got = labels(inv)
    assert (got["gpu.product"], got["gpu.count"], got["gpu.replicas"]) == (
        "NVIDIA-H100-80GB-HBM3",
        "1",
        "1",
    )
    assert got["mig-7g.40gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-7g.40gb"


def test_one_model_half_mig_counts_both_gpus_as_full() -> None:
    got = labels(node("h200x2", "half", _HALF % "7g.141gb"), "none")
    assert (got["gpu.count"], got["gpu.replicas"]) == ("2", "1")


# -- MIG strategies ----------------------------------------------------------------------------


def test_none_ignores_mig() -> None:
    got = labels(node("h200", "all-balanced"), "none")
    assert "mig.strategy" not in got
    assert not any(k.startswith("mig-") for k in got)
    assert (got["gpu.product"], got["gpu.count"], got["gpu.memory"]) == (
        "NVIDIA-H200",
        "1",
        "143771",
    )
    assert got["mig.capable"] == "true"


def test_mixed_one_key_set_per_mig_device_name() -> None:
    got = labels(node("h200x2", "all-balanced"))
    assert got["mig.strategy"] == "mixed"
    assert got["mig-1g.18gb.count"] == "4"
    assert got["mig-1g.18gb.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert (got["mig-1g.18gb.replicas"], got["mig-1g.18gb.sharing-strategy"]) == ("1", "none")
    assert got["mig-3g.71gb.memory"] == "71424"
    assert got["mig-3g.71gb.multiprocessors"] == "60"
    assert (got["mig-3g.71gb.slices.gi"], got["mig-3g.71gb.slices.ci"]) == ("3", "3")
    assert got["mig-2g.35gb.engines.copy"] == "2"
    assert (got["gpu.count"], got["gpu.product"]) == ("2", "NVIDIA-H200")


def test_mixed_plus_attributes_become_dots() -> None:
    got = labels(node("h200", "all-1g.18gb.me"))
    assert got["mig-1g.18gb.me.count"] == "1"
    assert got["mig-1g.18gb.me.product"] == "NVIDIA-H200-MIG-1g.18gb.me"
    assert got["mig-1g.18gb.me.engines.ofa"] == "1"


def test_single_valid_overrides_gpu() -> None:
    got = labels(node("h200x2", "all-1g.18gb"), "single")
    assert got["mig.strategy"] == "single"
    assert got["gpu.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert (got["gpu.count"], got["gpu.replicas"], got["gpu.sharing-strategy"]) == (
        "14",
        "1",
        "none",
    )
    assert (got["gpu.memory"], got["gpu.multiprocessors"]) == ("16384", "16")
    assert (got["gpu.slices.gi"], got["gpu.slices.ci"], got["gpu.engines.copy"]) == ("1", "1", "1")
    assert (got["gpu.family"], got["gpu.compute.major"]) == ("hopper", "9")  # the parent's
    assert not any(k.startswith("mig-") for k in got)


def test_single_one_name_over_two_models() -> None:
    got = labels(node("a100-40gb,h100-80gb", "all-1g.10gb"), "single")
    assert got["gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb"  # the first MIG device's
    assert got["gpu.count"] == str(4 + 7)


_INVALID = {
    "gpu.product": "NVIDIA-H200-MIG-INVALID",
    "gpu.count": "0",
    "gpu.replicas": "0",
    "gpu.sharing-strategy": "",
    "gpu.memory": "0",
}


@pytest.mark.parametrize(
    ("spec", "config", "text"),
    [
        ("h200", "all-balanced", None),  # profiles differ
        ("h200", "all-enabled", None),  # MIG enabled, no MIG device
        ("h200x2", "half", _HALF % "7g.141gb"),  # one GPU MIG-enabled, one not
    ],
    ids=["profiles-differ", "enabled-but-empty", "enabled-and-disabled"],
)
def test_single_invalid(spec: str, config: str, text: str | None) -> None:
    got = labels(node(spec, config, text), "single")
    assert {k: got[k] for k in _INVALID} == _INVALID
    assert "gpu.multiprocessors" not in got
    assert got["gpu.family"] == "hopper"


def test_single_invalid_when_a_gpu_instance_lacks_its_compute_instance() -> None:
    inv = node("h200", "all-7g.141gb")
    bare = tuple(replace(s, ci_id=None, mig_uuid=None, attributes=None) for s in inv.gpus[0].slices)
    inv = replace(inv, gpus=(replace(inv.gpus[0], slices=bare),))
    got = labels(inv, "single")
    assert got["gpu.product"] == "NVIDIA-H200-MIG-INVALID"
    assert not any(k.startswith("mig-") for k in labels(inv))


def test_single_without_mig_is_the_full_gpu() -> None:
    got = labels(node("h200x2"), "single")
    assert (got["mig.strategy"], got["gpu.product"], got["gpu.count"]) == (
        "single",
        "NVIDIA-H200",
        "2",
    )


# -- MIG device names --------------------------------------------------------------------------


@pytest.mark.parametrize("key", MODEL_NAMES)
def test_gfd_names_agree_with_nvml_profile_names(key: str) -> None:
    """go-nvlib names a MIG device from its memory share; NVML's profile names say the same on
    every emulated model, so a config's profile and its label name one thing."""
    gpu = node(key).gpus[0]
    for p in gpu.profiles:
        attrs = MigAttributes(p.memory_bytes >> 20, 0, p.slice_count, p.slice_count, p.engines)
        assert mig_device_name(gpu, p.name, attrs) == p.name.replace("+", "."), p.name
    assert load_model(key).profiles


def test_rounding_half_away_from_zero() -> None:
    """3g.71gb on an H200: 4/8 of 141 GiB is 70.5 GB, which go-nvlib rounds to 71."""
    gpu = node("h200").gpus[0]
    attrs = MigAttributes(71424, 60, 3, 3, gpu.profiles[0].engines)
    assert mig_device_name(gpu, "3g.71gb", attrs) == "3g.71gb"


def test_compute_instance_profiles_are_named_and_counted_per_compute_instance() -> None:
    """A 3g GPU instance holding three 1-slice compute instances: three `1c.3g.71gb` devices."""
    inv = node("h200", "all-3g.71gb")
    gpu = inv.gpus[0]
    (gi, *_), one = gpu.slices, gpu.slices[0].attributes
    assert one is not None
    cis = tuple(
        replace(gi, ci_id=i, attributes=replace(one, ci_slice_count=1, multiprocessor_count=20))
        for i in range(3)
    )
    inv = replace(inv, gpus=(replace(gpu, slices=cis),))
    got = labels(inv)
    assert got["mig-1c.3g.71gb.count"] == "3"
    assert got["mig-1c.3g.71gb.product"] == "NVIDIA-H200-MIG-1c.3g.71gb"
    assert (got["mig-1c.3g.71gb.slices.gi"], got["mig-1c.3g.71gb.slices.ci"]) == ("3", "1")
    assert got["mig-1c.3g.71gb.multiprocessors"] == "20"


def test_without_device_attributes_the_profile_speaks() -> None:
    inv = node("h200", "all-2g.35gb")
    gpu = inv.gpus[0]
    bare = tuple(replace(s, attributes=None) for s in gpu.slices)
    got = labels(replace(inv, gpus=(replace(gpu, slices=bare),)))
    assert got["mig-2g.35gb.memory"] == "33280"
    assert got["mig-2g.35gb.slices.ci"] == "2"


def test_no_gpu_no_labels() -> None:
    assert labels(Inventory("580.159.04", 13000, ())) == {}


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown MIG strategy 'all'"):
        gfd_labels(node("h200"), GfdOptions("all"))
