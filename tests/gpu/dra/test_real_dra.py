"""The DRA driver's ResourceSlices from real NVML (read-only): the same devices, names and
counters as from the emulator's model of the card, valid against resource.k8s.io/v1.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu`. Changes no GPU setting (no MIG
mode, no slice: preparing a claim would, and is covered on the emulator).
"""

from __future__ import annotations

from dataclasses import replace

import kubernetes_validate
import pytest

from nodeagent.dra.devices import gpu_devices, resource_slices
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import MODEL_NAMES, load_model

pytestmark = pytest.mark.gpu


def emulator_model(name: str) -> str | None:
    """The emulator's model of a card by the name NVML gives it ('NVIDIA H100 80GB HBM3' ->
    'h100-80gb'), among every model the emulator has; None: it models no such card."""
    return next((key for key in MODEL_NAMES if load_model(key).name == name), None)


def test_slices_validate(real_inventory: Inventory) -> None:
    for s in resource_slices(real_inventory, "gpu-node", "gpu.nodeagent.io"):
        pool = {"name": "gpu-node", "generation": 1, "resourceSliceCount": 1}
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": s.name}, "spec": {**s.spec, "pool": pool}}  # fmt: skip
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_devices_match_the_emulators_model(real_inventory: Inventory) -> None:
    real = real_inventory.gpus[0]
    model = emulator_model(real.name)
    if model is None:
        pytest.skip(f"no emulator model for {real.name}")
    session = NvmlSession(SimulatedNvml([model]))
    emulated = read_inventory(session)
    session.close()

    def shape(inv: Inventory) -> list[tuple[str, object, object]]:
        gpu = replace(inv.gpus[0], mig_current=False)
        return [
            (d["name"], d.get("capacity"), d.get("consumesCounters")) for d in gpu_devices(inv, gpu)
        ]

    print([name for name, _, _ in shape(real_inventory)])
    assert shape(real_inventory) == shape(emulated)
