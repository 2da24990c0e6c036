"""GFD's labels from real NVML (read-only): the PCI class and the versions the labels are made of.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu`. Changes no GPU setting.
"""

from __future__ import annotations

import re

import pytest

from nodeagent.labels.gfd import GfdOptions, gfd_labels
from nodeagent.nvml import Inventory

pytestmark = pytest.mark.gpu


def test_data_centre_gpus_are_3d_controllers(real_inventory: Inventory) -> None:
    for gpu in real_inventory.gpus:
        print(f"GPU {gpu.index} {gpu.name} {gpu.pci_bus_id} class {gpu.pci_class!r}")
        assert gpu.pci_class == 0x030200


def test_labels_carry_the_driver_version(real_inventory: Inventory) -> None:
    got = gfd_labels(real_inventory, GfdOptions("mixed", None))
    print(sorted(got.items()))
    assert got["cuda.driver-version.full"] == real_inventory.driver_version
    assert re.fullmatch(r"[0-9]+\.[0-9]+", got["cuda.runtime-version.full"])
    assert got["gpu.mode"] == "compute"
