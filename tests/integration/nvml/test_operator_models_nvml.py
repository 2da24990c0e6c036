"""nodeagent.nvml writes and reads on the GPU-operator models: the RTX PRO 6000's attribute
profiles and 12 memory slices, and a Blackwell layout, through the real nvml/ code."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.sim.models import load_model


def _ids(key: str) -> dict[str, int]:
    return {p.name.removeprefix("MIG "): p.id for p in load_model(key).profiles}


def test_rtx_pro_6000_attribute_profiles(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("rtx-pro-6000")
    ids = _ids("rtx-pro-6000")
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    for name, start in (("1g.24gb+gfx", 0), ("1g.24gb-me", 3), ("2g.48gb+me.all", 6)):
        gi = w.create_gpu_instance(0, ids[name], Placement(start, 6 if name[0] == "2" else 3))
        w.create_compute_instance(0, gi, int(name[0]))
    gpu = read_inventory(session).gpus[0]
    assert gpu.memory_slice_count == 12
    assert [(s.profile, s.placement.start, s.placement.size) for s in gpu.slices] == [
        ("1g.24gb+gfx", 0, 3),
        ("1g.24gb-me", 3, 3),
        ("2g.48gb+me.all", 6, 6),
    ]
    by_name = {p.name: p for p in gpu.profiles}
    assert by_name["1g.24gb+me.all"].engines.decoder == 4
    assert by_name["1g.24gb-me"].engines.decoder == 0
    assert by_name["2g.48gb"].multiprocessor_count == 94


def test_rtx_pro_6000_refuses_what_the_hardware_refuses(
    make_session: Callable[..., NvmlSession],
) -> None:
    session = make_session("rtx-pro-6000")
    ids = _ids("rtx-pro-6000")
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    w.create_gpu_instance(0, ids["2g.48gb"], Placement(0, 6))
    with pytest.raises(NvmlError) as overlap:
        w.create_gpu_instance(0, ids["1g.24gb"], Placement(3, 3))
    assert overlap.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    w.create_gpu_instance(0, ids["1g.24gb+me.all"], Placement(6, 3))
    with pytest.raises(NvmlError) as second:
        w.create_gpu_instance(0, ids["1g.24gb+me.all"], Placement(9, 3))
    assert second.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


@pytest.mark.parametrize("key", ["b200", "gb200", "gb300", "gh200-144gb", "h100-nvl", "h20"])
def test_balanced_layout_fills_the_gpu(make_session: Callable[..., NvmlSession], key: str) -> None:
    session = make_session(key)
    profiles = {p.slice_count: p for p in load_model(key).profiles if "+" not in p.name}
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    three, two = profiles[3], profiles[2]
    one = next(p for p in load_model(key).profiles if p.id == 19)
    layout = [(three, Placement(0, 4)), (two, Placement(4, 2)), (one, Placement(6, 1))]
    for p, where in layout:
        w.create_compute_instance(0, w.create_gpu_instance(0, p.id, where), p.slice_count)
    gpu = read_inventory(session).gpus[0]
    assert [s.multiprocessor_count for s in gpu.slices] == [
        three.multiprocessor_count,
        two.multiprocessor_count,
        one.multiprocessor_count,
    ]
    assert sum(s.memory_total_bytes for s in gpu.slices) <= gpu.memory_total_bytes
