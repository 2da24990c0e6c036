"""The emulator's `status --output json` of an H200 equals the one nodeagent read off a real H200.

tests/fixtures/h200-real-status.json is `nodeagent status -o json` run on the lent H200
(MIG disabled, no processes). Only identity fields (UUID, PCI bus id) may differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from nodeagent.nvml import NvmlSession, read_inventory

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "h200-real-status.json"


def test_emulated_h200_reads_like_the_real_one(make_session: Callable[..., NvmlSession]) -> None:
    real = json.loads(REAL.read_text())
    emulated = json.loads(json.dumps(read_inventory(make_session("h200")).to_dict()))
    for data in (real, emulated):
        for gpu in data["gpus"]:
            gpu.pop("uuid")
            gpu.pop("pci_bus_id")
    # Read since the capture was taken (and checked on real NVML by tests/gpu): the PCI class,
    # the fabric (tests/gpu/test_real_platform_labels.py) and the node's vGPUs.
    newer = {"pci_class", "pci_subsystem_id", "fabric"}
    assert emulated.pop("vgpu") is None  # the emulated H200 has no PCI config space to read
    for gpu in emulated["gpus"]:
        assert newer <= set(gpu)
        for key in newer:
            gpu.pop(key)
    assert emulated == real
