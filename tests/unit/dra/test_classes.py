"""The DeviceClasses with the device plugin's extended resource names (KEP-5004), generated from
the GPUs' MIG profiles, and the shipped file kept equal to what the generator says for its
models. The classes against the real scheduler: tests/k8s/test_extended_resources_real.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nodeagent.dra.classes import device_classes, dump_classes, mig_names
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.cli import Result

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "daemonset/components/dra/deviceclasses.yaml"
SHIPPED_MODELS = "a100-40gb,a100-80gb,h100-80gb,h100-nvl,h200"
DRIVER = "gpu.nodeagent.io"


def inventory(spec: str) -> Inventory:
    session = NvmlSession(SimulatedNvml(parse_spec(spec)))
    try:
        return read_inventory(session)
    finally:
        session.close()


def _by_resource(classes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        c["spec"]["extendedResourceName"]: c for c in classes if "extendedResourceName" in c["spec"]
    }


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("h200", {"1g.18gb", "1g.18gb.me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}),
        (
            "a100-40gb",
            {"1g.5gb", "1g.5gb.me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
        ),
        ("a30", {"1g.6gb", "1g.6gb.me", "2g.12gb", "2g.12gb.me", "4g.24gb"}),
    ],
)
def test_the_device_plugins_mig_names(spec: str, names: set[str]) -> None:
    """As GFD and the plugin name them ('+' written '.'): nvidia.com/mig-<name>."""
    assert set(mig_names(inventory(spec).gpus)) == names


def test_a_class_per_name_selecting_its_profile() -> None:
    classes = device_classes([inventory("h200")], DRIVER)
    assert [c["metadata"]["name"] for c in classes[:2]] == [DRIVER, f"mig.{DRIVER}"]
    by = _by_resource(classes)
    assert set(by) == {"nvidia.com/gpu"} | {
        f"nvidia.com/mig-{n}" for n in mig_names(inventory("h200").gpus)
    }
    (gpu,) = by["nvidia.com/gpu"]["spec"]["selectors"]
    assert (
        gpu["cel"]["expression"]
        == 'device.driver == "gpu.nodeagent.io" && device.attributes["gpu.nodeagent.io"].type == "gpu"'
    )
    me = by["nvidia.com/mig-1g.18gb.me"]
    assert me["metadata"]["name"] == "mig-1g.18gb.me.gpu.nodeagent.io"
    assert me["spec"]["selectors"][0]["cel"]["expression"] == (
        'device.driver == "gpu.nodeagent.io" && device.attributes["gpu.nodeagent.io"].type == "mig"'
        ' && device.attributes["gpu.nodeagent.io"].profile == "1g.18gb+me"'
    )
    for c in classes:
        kubernetes_validate.validate(c, "1.37.0", strict=True)


def test_one_name_of_several_models_is_one_class() -> None:
    """nvidia.com/mig-1g.10gb is A100 40GB's 2-slice 1g.10gb and A100 80GB's 1-slice one: as
    with the device plugin, the name means what the node has, so one class selects both."""
    classes = device_classes([inventory("a100-40gb"), inventory("a100-80gb")], DRIVER)
    (selector,) = _by_resource(classes)["nvidia.com/mig-1g.10gb"]["spec"]["selectors"]
    assert selector["cel"]["expression"].endswith('.profile == "1g.10gb"')


def test_a_profile_named_differently_on_two_models_names_the_product() -> None:
    """A profile that carries two plugin names (the plugin's name rounds the memory of the GPU
    it is on) is told apart by productName in each class."""
    h200 = inventory("h200")
    bigger = replace(
        h200.gpus[0], name="Some GPU", memory_total_bytes=2 * h200.gpus[0].memory_total_bytes
    )
    classes = device_classes([h200, replace(h200, gpus=(bigger,))], DRIVER)
    by = _by_resource(classes)
    (selector,) = by["nvidia.com/mig-1g.18gb"]["spec"]["selectors"]
    assert '.productName == "NVIDIA H200" && ' in selector["cel"]["expression"]
    assert '.profile == "1g.18gb"' in selector["cel"]["expression"]
    assert "Some GPU" not in selector["cel"]["expression"]
    other = [r for r, c in by.items() if '"Some GPU"' in yaml.safe_dump(c)]
    assert other and "nvidia.com/mig-1g.18gb" not in other


def test_the_shipped_file_is_what_the_generator_says() -> None:
    """daemonset/components/dra/deviceclasses.yaml is `nodeagent --simulate SHIPPED_MODELS dra
    deviceclasses`: regenerate it when the generator or the models change."""
    shipped = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    assert shipped == device_classes([inventory(SHIPPED_MODELS)], DRIVER)
    assert f"--simulate {SHIPPED_MODELS} dra deviceclasses" in SHIPPED.read_text()


def test_the_command_prints_the_classes_for_the_nodes_gpus(cli: Callable[..., Result]) -> None:
    res = cli("--simulate", "h200x2,a30", "dra", "deviceclasses")
    assert res.returncode == 0, res.stderr
    printed = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert printed == device_classes([inventory("h200x2,a30")], DRIVER)
    assert res.stdout == dump_classes(printed, res.stdout.split("apiVersion:")[0])
    assert "#   NVIDIA A30\n#   NVIDIA H200\n" in res.stdout
    other = cli(
        "--simulate",
        "h200",
        "dra",
        "deviceclasses",
        env={"NODEAGENT_DRA_DRIVER": "gpu.example.com"},
    )
    assert other.returncode == 0, other.stderr
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(other.stdout) if d]
    assert names[:4] == [
        "gpu.example.com",
        "mig.gpu.example.com",
        "mps.gpu.example.com",
        "mig-1g.18gb.gpu.example.com",
    ]
