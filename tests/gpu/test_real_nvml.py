"""Real NVML through nodeagent.nvml, compared with the emulator's model (read-only).

Run on the GPU machine: `python -m pytest -m gpu tests/gpu`. Changes no GPU setting.
"""

from __future__ import annotations

import pytest

from nodeagent.nvml import Inventory
from nodeagent.sim.models import MIB, load_model

pytestmark = pytest.mark.gpu

MODEL_BY_NAME = {
    "NVIDIA H200": "h200",
    "NVIDIA H100 80GB HBM3": "h100-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A30": "a30",
}


def test_every_gpu_matches_its_emulator_model(real_inventory: Inventory) -> None:
    assert real_inventory.gpus, "NVML reported no GPU"
    for gpu in real_inventory.gpus:
        key = MODEL_BY_NAME.get(gpu.name)
        if key is None:
            pytest.skip(f"no emulator model for {gpu.name}")
        model = load_model(key)
        print(f"GPU {gpu.index} {gpu.name} {gpu.uuid} {gpu.pci_bus_id} MIG={gpu.mig_current}")
        assert gpu.pci_device_id == model.pci_device_id
        assert gpu.compute_capability == model.compute_capability
        assert gpu.memory_total_bytes == model.memory_total_bytes
        assert gpu.mig_capable
        assert gpu.memory_slice_count == model.memory_slices
        want = {p.id: p for p in model.profiles}
        got = {p.id: p for p in gpu.profiles}
        assert set(got) == set(want)
        for pid, p in sorted(got.items()):
            m = want[pid]
            print(
                f"  profile {pid:>2} {p.name:<11} SMs {p.multiprocessor_count:>3} "
                f"{p.memory_bytes // MIB:>6} MiB placements {[str(x) for x in p.placements]}"
            )
            assert "MIG " + p.name == m.name
            assert p.memory_bytes == m.memory_size_mb * MIB
            assert p.multiprocessor_count == m.multiprocessor_count
            assert (p.slice_count, p.instance_count) == (m.slice_count, m.instance_count)
            assert [(x.start, x.size) for x in p.placements] == list(m.placements)
            assert (p.engines.copy, p.engines.decoder, p.engines.encoder) == (
                m.copy_engine_count,
                m.decoder_count,
                m.encoder_count,
            )
            assert (p.engines.jpeg, p.engines.ofa) == (m.jpeg_count, m.ofa_count)


def test_driver_and_identity_fields(real_inventory: Inventory) -> None:
    assert real_inventory.driver_version.count(".") >= 1
    assert real_inventory.cuda_driver_version >= 12000
    uuids = [g.uuid for g in real_inventory.gpus]
    buses = [g.pci_bus_id for g in real_inventory.gpus]
    assert len(set(uuids)) == len(uuids) and all(u.startswith("GPU-") for u in uuids)
    assert len(set(buses)) == len(buses)
    for gpu in real_inventory.gpus:
        assert 0 < gpu.memory_used_bytes < gpu.memory_total_bytes
        assert gpu.memory_used_bytes + gpu.memory_free_bytes <= gpu.memory_total_bytes
        assert gpu.architecture == "hopper" if gpu.name == "NVIDIA H200" else True
