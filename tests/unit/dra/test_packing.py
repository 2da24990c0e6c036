"""The published device order makes the scheduler's first fit pack (nodeagent.dra.firstfit
models it; tests/k8s/test_packing_real.py checks the real kube-scheduler does the same)."""

from __future__ import annotations

import pytest

from nodeagent.dra.devices import placement_order, resource_slices
from nodeagent.dra.firstfit import FirstFit, profile_is, whole_gpu
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import Inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec


def _node(spec: str) -> Inventory:
    return read_inventory(NvmlSession(SimulatedNvml(parse_spec(spec))))


def _model(inventory: Inventory) -> FirstFit:
    return FirstFit(resource_slices(inventory, "n", "gpu.nodeagent.io"))


@pytest.mark.parametrize(
    ("spec", "profile", "n"),
    [("h200", "1g.18gb", 7), ("h100-80gb", "1g.10gb", 7), ("b200", "1g.23gb", 7)],
)
def test_a_gpu_takes_as_many_small_slices_as_it_has(spec: str, profile: str, n: int) -> None:
    model = _model(_node(spec))
    got = [model.allocate(profile_is(profile)) for _ in range(n + 1)]
    assert None not in got[:n] and got[n] is None
    assert len(set(got[:n])) == n


def test_three_two_one_one_fit_on_one_h200() -> None:
    model = _model(_node("h200"))
    got = [model.allocate(profile_is(p)) for p in ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")]
    assert got == [
        "gpu-0-mig-3g71gb-9-4",
        "gpu-0-mig-2g35gb-14-2",
        "gpu-0-mig-1g18gb-19-1",
        "gpu-0-mig-1g18gb-19-0",
    ]
    # and the whole GPU is not free any more
    assert model.allocate(whole_gpu) is None


def test_placements_are_published_from_the_top() -> None:
    gpu = _node("h200").gpus[0]
    by_name = {p.name: p for p in gpu.profiles}
    assert [a.start for a in placement_order(by_name["1g.18gb"])] == [6, 5, 4, 3, 2, 1, 0]
    assert [a.start for a in placement_order(by_name["3g.71gb"])] == [4, 0]


def test_claims_fill_gpu_0_first_and_a_released_slice_is_taken_again() -> None:
    model = _model(_node("h200x2"))
    first = [model.allocate(profile_is("1g.18gb")) for _ in range(8)]
    assert all(name is not None and name.startswith("gpu-0-") for name in first[:7])
    assert first[7] is not None and first[7].startswith("gpu-1-")
    model.release(first[3])  # type: ignore[arg-type]
    assert model.allocate(profile_is("1g.18gb")) == first[3]
