"""nodeagent.nvml reads over the emulator: every Inventory field a user sees."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.nvml.inventory import ARCHITECTURES
from nodeagent.sim.models import MIB, MODEL_NAMES, load_model


@pytest.mark.parametrize("key", MODEL_NAMES)
def test_inventory_matches_the_model(make_session: Callable[..., NvmlSession], key: str) -> None:
    inv = read_inventory(make_session(key))
    model = load_model(key)
    (gpu,) = inv.gpus
    assert inv.driver_version == model.driver_version
    assert inv.cuda_driver_version == model.cuda_driver_version
    assert inv.cuda_version == "13.0"
    assert gpu.index == 0
    assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40
    assert gpu.name == model.name
    assert gpu.pci_bus_id == "00000000:18:00.0"
    assert gpu.pci_device_id == model.pci_device_id
    assert gpu.memory_total_bytes == model.memory_total_bytes
    assert gpu.memory_used_bytes == model.memory_reserved_bytes
    assert gpu.memory_free_bytes == model.memory_total_bytes - model.memory_reserved_bytes
    assert gpu.compute_capability == model.compute_capability
    assert gpu.architecture == ARCHITECTURES[model.architecture]
    assert gpu.mig_capable and not gpu.mig_current and not gpu.mig_pending
    assert gpu.memory_slice_count == model.memory_slices
    assert gpu.slices == () and gpu.processes == ()
    by_id = {p.id: p for p in model.profiles}
    assert {p.id for p in gpu.profiles} == set(by_id)
    for p in gpu.profiles:
        want = by_id[p.id]
        assert "MIG " + p.name == want.name
        assert p.memory_bytes == want.memory_size_mb * MIB
        assert p.multiprocessor_count == want.multiprocessor_count
        assert p.slice_count == want.slice_count and p.instance_count == want.instance_count
        assert [(q.start, q.size) for q in p.placements] == list(want.placements)
        assert (p.engines.copy, p.engines.decoder, p.engines.jpeg, p.engines.ofa) == (
            want.copy_engine_count,
            want.decoder_count,
            want.jpeg_count,
            want.ofa_count,
        )


def test_multi_gpu_node_has_distinct_identities(make_session: Callable[..., NvmlSession]) -> None:
    inv = read_inventory(make_session("a100-40gbx2,h100-80gb"))
    assert [g.index for g in inv.gpus] == [0, 1, 2]
    assert [g.name for g in inv.gpus] == [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA H100 80GB HBM3",
    ]
    assert len({g.uuid for g in inv.gpus}) == 3
    assert len({g.pci_bus_id for g in inv.gpus}) == 3


def test_slices_with_processes(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("h200")
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    gi3 = w.create_gpu_instance(0, 9, Placement(4, 4))
    w.create_compute_instance(0, gi3, 3)
    gi1 = w.create_gpu_instance(0, 19, Placement(0, 1))
    w.create_compute_instance(0, gi1, 1)
    bare = w.create_gpu_instance(0, 14, Placement(2, 2))  # a GI left without its CI
    inv = read_inventory(session)
    big = next(s for s in inv.gpus[0].slices if s.gi_id == gi3)
    session.lib.attach(big.mig_uuid, 4242, 10 * 1024 * MIB)
    inv = read_inventory(session)
    gpu = inv.gpus[0]
    assert gpu.mig_current
    assert [(s.profile, s.placement.start) for s in gpu.slices] == [
        ("1g.18gb", 0),
        ("2g.35gb", 2),
        ("3g.71gb", 4),
    ]
    one, two, three = gpu.slices
    assert one.ci_id == 0 and one.mig_uuid and one.mig_uuid.startswith("MIG-")
    assert one.multiprocessor_count == 16 and one.memory_total_bytes == 16384 * MIB
    assert two.gi_id == bare and two.ci_id is None and two.mig_uuid is None
    assert three.multiprocessor_count == 60
    assert [(p.pid, p.memory_bytes) for p in three.processes] == [(4242, 10 * 1024 * MIB)]
    assert three.memory_used_bytes == 10 * 1024 * MIB and three.in_use
    assert not one.in_use
    assert gpu.memory_used_bytes == load_model("h200").memory_reserved_bytes + 10 * 1024 * MIB


def test_processes_on_a_full_gpu(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("h200x2")
    session.lib.attach("1", 77, 2048 * MIB)
    inv = read_inventory(session)
    assert inv.gpus[0].processes == ()
    assert [(p.pid, p.memory_bytes) for p in inv.gpus[1].processes] == [(77, 2048 * MIB)]


def test_json_form_has_the_whole_inventory(make_session: Callable[..., NvmlSession]) -> None:
    data = read_inventory(make_session("h200")).to_dict()
    gpu = data["gpus"][0]
    assert gpu["pci_device_id"] == "0x233510DE"
    assert {p["name"] for p in gpu["profiles"]} == {
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    }
    assert data["cuda_version"] == "13.0"
