"""Taints on the DRA devices for the faults found (nodeagent.dra.taints): a GPU's fault taints
its whole device and its MIG devices, a slice's only that placement's device."""

from __future__ import annotations

import calendar
import time

import pytest

from nodeagent.dra.devices import resource_slices
from nodeagent.dra.taints import DeviceFault, device_faults, device_names, with_taints
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from nodeagent.state.faults import Fault, FaultKey

DRIVER = "gpu.nodeagent.io"
SINCE = calendar.timegm((2026, 5, 1, 12, 0, 0))
SLICES = resource_slices(
    read_inventory(NvmlSession(SimulatedNvml(parse_spec("h200x2")))), "node-1", DRIVER
)
NAMES = device_names(SLICES)


def taints(faults: dict[FaultKey, Fault], fatal: tuple[str, ...] = ()) -> dict[str, list]:  # type: ignore[type-arg]
    out = with_taints(SLICES, device_faults(SLICES, faults, fatal), DRIVER)
    return {d["name"]: d["taints"] for s in out for d in s.spec.get("devices", ()) if "taints" in d}


def test_a_gpu_fault_taints_the_gpu_and_every_slice_of_it_and_nothing_else() -> None:
    found = taints({FaultKey(0): Fault(("xid-79",), SINCE)})
    gpu0 = [n for n in NAMES if n == "gpu-0" or n.startswith("gpu-0-")]
    assert sorted(found) == sorted(gpu0) and len(gpu0) == 26
    assert found["gpu-0"] == [
        {
            "key": "gpu.nodeagent.io/unhealthy",
            "value": "xid-79",
            "effect": "NoSchedule",
            "timeAdded": "2026-05-01T12:00:00Z",
        }
    ]


def test_a_slice_fault_taints_that_placement_only() -> None:
    found = taints({FaultKey(1, 19, 3): Fault(("ecc-uncorrected",), SINCE)}, ("ecc-uncorrected",))
    assert list(found) == ["gpu-1-mig-1g18gb-19-3"]
    assert found["gpu-1-mig-1g18gb-19-3"][0]["effect"] == "NoExecute"


def test_the_gpu_and_the_slice_faults_combine_on_the_slice() -> None:
    found = taints(
        {
            FaultKey(0): Fault(("row-remap-pending",), SINCE + 60),
            FaultKey(0, 19, 6): Fault(("xid-48",), SINCE),
        },
        ("xid",),
    )
    (t,) = found["gpu-0-mig-1g18gb-19-6"]
    assert (t["value"], t["effect"], t["timeAdded"]) == (
        "row-remap-pending.xid-48",
        "NoExecute",
        "2026-05-01T12:00:00Z",
    )
    assert found["gpu-0"][0]["effect"] == "NoSchedule"


def test_untouched_slices_are_the_same_objects_and_nothing_is_changed_in_place() -> None:
    before = [(s.name, repr(s.spec)) for s in SLICES]
    out = with_taints(
        SLICES, device_faults(SLICES, {FaultKey(1): Fault(("xid-79",), SINCE)}, ()), DRIVER
    )
    assert [(s.name, repr(s.spec)) for s in SLICES] == before
    changed = [s.name for s, o in zip(SLICES, out, strict=True) if s is not o]
    assert changed == ["node-1-gpu-nodeagent-io-gpu-1"]
    assert with_taints(SLICES, {}, DRIVER) == SLICES


@pytest.mark.parametrize(
    ("kinds", "value"),
    [
        (("xid-79",), "xid-79"),
        (
            tuple(f"xid-{100000 + i}" for i in range(9)),
            ".".join(f"xid-{100000 + i}" for i in range(5)),
        ),
    ],
)
def test_the_value_is_a_label_value(kinds: tuple[str, ...], value: str) -> None:
    reason = DeviceFault(kinds, time.time(), "NoSchedule").reason
    assert reason == value and len(reason) <= 63
