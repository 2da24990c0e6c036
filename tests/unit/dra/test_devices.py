"""The node's GPUs as ResourceSlices (KEP-4815 partitionable devices), on the emulator's models.

Device and counter names follow NVIDIA/k8s-dra-driver-gpu@22407113785e78c7763b4637689a201eb39c6199
(cmd/gpu-kubelet-plugin/partitions.go, mig.go, deviceinfo.go); the slice layout and limits
kubernetes/api@10b39a39bcee995dfe7cd5e8e7b922be5e46f1e2:resource/v1/types.go.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from itertools import combinations
from typing import Any

import kubernetes_validate
import pytest

from nodeagent.dra.devices import (
    DeviceRef,
    SliceSpec,
    counter_set,
    gpu_device,
    gpu_devices,
    parse_device_name,
    resource_slices,
)
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DRIVER = "gpu.nodeagent.io"


def inventory(spec: str, mig: bool = False) -> Inventory:
    session = NvmlSession(SimulatedNvml(parse_spec(spec)))
    inv = read_inventory(session)
    session.close()
    return replace(inv, gpus=tuple(replace(g, mig_current=mig) for g in inv.gpus))


@pytest.mark.parametrize(
    ("spec", "mig", "whole", "partitions", "slices"),
    [
        # Hopper changes MIG mode without a reset: the GPU and its 25 placements, either mode.
        ("h200", False, 1, 7 + 7 + 4 + 3 + 2 + 1 + 1, ["counters-0", "gpu-0"]),
        ("h200", True, 1, 25, ["counters-0", "gpu-0"]),
        # Ampere needs a reset: the mode it is in decides.
        ("a100-40gb", False, 1, 0, ["gpu-0"]),
        ("a100-40gb", True, 0, 25, ["counters-0", "gpu-0"]),
        ("a30", True, 0, 4 + 4 + 2 + 2 + 1, ["counters-0", "gpu-0"]),
        ("a30", False, 1, 0, ["gpu-0"]),
    ],
)
def test_devices_per_model(
    spec: str, mig: bool, whole: int, partitions: int, slices: list[str]
) -> None:
    inv = inventory(spec, mig)
    devices = gpu_devices(inv, inv.gpus[0])
    kinds = [d["attributes"]["type"]["string"] for d in devices]
    assert kinds.count("gpu") == whole
    assert kinds.count("mig") == partitions
    specs = resource_slices(inv, "node-1", DRIVER)
    assert [s.name for s in specs] == [f"node-1-gpu-nodeagent-io-{n}" for n in slices]


def test_h200_device_names_attributes_and_capacity() -> None:
    inv = inventory("h200")
    gpu = inv.gpus[0]
    devices = {d["name"]: d for d in gpu_devices(inv, gpu)}
    assert "gpu-0-mig-1g18gb-19-6" in devices
    assert "gpu-0-mig-1g18gb-me-20-0" in devices  # "+" becomes "-", as toRFC1123Compliant does
    assert "gpu-0-mig-7g141gb-0-0" in devices
    one_g = devices["gpu-0-mig-1g35gb-15-2"]
    assert one_g["attributes"]["profile"] == {"string": "1g.35gb"}
    assert one_g["attributes"]["parentUUID"] == {"string": gpu.uuid}
    assert one_g["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert one_g["attributes"]["driverVersion"] == {"version": "580.159.4"}
    assert one_g["capacity"]["memory"] == {"value": str(34896609280)}
    assert one_g["capacity"]["multiprocessors"] == {"value": "26"}
    (use,) = one_g["consumesCounters"]
    assert use["counterSet"] == "gpu-0-counter-set"
    assert {k for k in use["counters"] if k.startswith("memory-slice")} == {
        "memory-slice-2",
        "memory-slice-3",
    }
    whole = devices["gpu-0"]
    assert whole["attributes"]["uuid"] == {"string": gpu.uuid}
    assert whole["attributes"]["productName"] == {"string": "NVIDIA H200"}
    assert whole["consumesCounters"][0]["counters"] == counter_set(gpu)["counters"]


@pytest.mark.parametrize("spec", ["h200", "a100-40gb", "a30"])
def test_names_are_dns_labels_and_parse_back(spec: str) -> None:
    inv = inventory(spec, mig=True)
    for d in gpu_devices(inv, inv.gpus[0]):
        assert DNS_LABEL.match(d["name"]), d["name"]
        ref = parse_device_name(d["name"])
        assert ref is not None and ref.gpu == 0
        if ref.is_mig:
            assert d["attributes"]["memorySliceStart"] == {"int": ref.start}
    assert parse_device_name("gpu-3") == DeviceRef(3)
    assert parse_device_name("cpu-0") is None


def _consumed(devices: list[dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in devices:
        for name, c in d["consumesCounters"][0]["counters"].items():
            total[name] = total.get(name, 0) + int(c["value"])
    return total


def _partitions(inv: Inventory) -> tuple[dict[str, int], dict[tuple[int, int], dict[str, Any]]]:
    """GPU 0's counters, and its partition devices by (profile id, placement start)."""
    gpu = inv.gpus[0]
    available = {k: int(v["value"]) for k, v in counter_set(gpu)["counters"].items()}
    by_place = {
        (ref.profile_id or 0, ref.start or 0): d
        for d in gpu_devices(inv, gpu)
        if (ref := parse_device_name(d["name"])) is not None and ref.is_mig
    }
    return available, by_place


def _fits(devices: list[dict[str, Any]], available: dict[str, int]) -> bool:
    return all(v <= available[k] for k, v in _consumed(devices).items())


def _layouts(geometry: Geometry, candidates: list[Instance]) -> list[list[Instance]]:
    """Every non-empty valid layout (any mix of profiles), by depth-first search."""
    found: list[list[Instance]] = []

    def grow(layout: list[Instance], rest: list[Instance]) -> None:
        for i, inst in enumerate(rest):
            if geometry.fits(layout, inst):
                found.append([*layout, inst])
                grow([*layout, inst], rest[i + 1 :])

    grow([], candidates)
    return found


@pytest.mark.parametrize("spec", ["h200", "a100-40gb", "a30"])
def test_counters_admit_exactly_the_valid_layouts(spec: str) -> None:
    """Every layout the hardware accepts (every mix of profiles) fits the counter set; two
    placements that share a memory slice never do, nor the whole GPU with any slice."""
    inv = inventory(spec, mig=True)
    gpu = inv.gpus[0]
    available, by_place = _partitions(inv)
    geometry = Geometry.of(gpu)
    candidates = [i for p in gpu.profiles for i in geometry.instances(p)]
    layouts = _layouts(geometry, candidates)
    for layout in layouts:
        assert _fits([by_place[(i.profile_id, i.start)] for i in layout], available), layout
    whole = gpu_device(inv, gpu)  # as a Hopper offers it beside its slices
    for a, b in combinations(candidates, 2):
        if a.slots & b.slots:
            pair = [by_place[(a.profile_id, a.start)], by_place[(b.profile_id, b.start)]]
            assert not _fits(pair, available)
    for device in by_place.values():
        assert not _fits([whole, device], available)
    assert len(layouts) >= 75  # A30: 75 layouts; A100 and H200: more


def test_eight_gpus_split_counters_and_devices_within_api_limits() -> None:
    specs = resource_slices(inventory("h200x9"), "n", DRIVER)
    counters = [s for s in specs if "sharedCounters" in s.spec]
    assert [len(s.spec["sharedCounters"]) for s in counters] == [8, 1]
    for s in specs:
        assert len(s.spec.get("devices", [])) <= 64
        assert not ("devices" in s.spec and "sharedCounters" in s.spec)
        for d in s.spec.get("devices", []):
            assert len(d["attributes"]) + len(d["capacity"]) <= 32
    only = resource_slices(inventory("h200x2"), "n", DRIVER, gpus={1})
    assert [s.name for s in only] == ["n-gpu-nodeagent-io-counters-0", "n-gpu-nodeagent-io-gpu-1"]


@pytest.mark.parametrize("spec", ["h200x2", "a100-40gb"])
def test_slices_validate_against_the_v1_schema(spec: str) -> None:
    validate_slices(resource_slices(inventory(spec), "node-1", DRIVER))


def validate_slices(slices: Iterable[SliceSpec]) -> None:
    """Each slice, as the publisher sends it, valid against the v1 ResourceSlice schema."""
    for s in slices:
        obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": s.name},
            "spec": {
                **s.spec,
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 2},
            },
        }
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_only_placements_not_made_yet_carry_binding_conditions() -> None:
    from nodeagent.nvml import MigWriter

    session = NvmlSession(SimulatedNvml(parse_spec("h200")))
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    gpu = read_inventory(session).gpus[0]
    profile = next(p for p in gpu.profiles if p.name == "1g.18gb")
    at = next(p for p in profile.placements if p.start == 6)
    gi = writer.create_gpu_instance(0, profile.id, at)
    writer.create_compute_instance(0, gi, 1, 0, full=True)
    inv = read_inventory(session)
    session.close()
    (_, devices) = resource_slices(inv, "n", DRIVER, binding=True)
    binding = {d["name"]: d.get("bindingConditions") for d in devices.spec["devices"]}
    assert binding["gpu-0-mig-1g18gb-19-6"] is None  # made: nothing to wait for
    waiting = {n for n, b in binding.items() if b}
    assert waiting == set(binding) - {"gpu-0-mig-1g18gb-19-6", "gpu-0"}
    d = next(d for d in devices.spec["devices"] if d["name"] == "gpu-0-mig-1g18gb-19-5")
    assert d["bindingConditions"] == ["gpu.nodeagent.io/SliceReady"]
    assert d["bindingFailureConditions"] == ["gpu.nodeagent.io/SliceFailed"]
    assert "bindsToNode" not in d
    plain = resource_slices(inv, "n", DRIVER)
    assert not any(d.get("bindingConditions") for s in plain for d in s.spec.get("devices", []))
    for s in resource_slices(inv, "node-1", DRIVER, binding=True):
        pool = {"name": "node-1", "generation": 1, "resourceSliceCount": 2}
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": s.name}, "spec": {**s.spec, "pool": pool}}  # fmt: skip
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
