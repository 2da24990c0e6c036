"""gpu.clique and vgpu.* on real NVML (read-only): the labels nodeagent gives agree with what
NVML and the PCI config space say, read here directly, not through nodeagent.nvml.

Run on the GPU machine: `python3 -m pytest -m gpu tests/gpu/test_real_platform_labels.py -s`.
Changes no GPU setting. The lent H200 is expected to report no clique (no multi-node NVLink
fabric: NOT_SUPPORTED, or a registration without a cluster); the test asserts agreement, and
prints what NVML said.
"""

from __future__ import annotations

import ctypes
import os
import uuid
from pathlib import Path

import pytest

from nodeagent.labels.gfd import GfdOptions, gfd_labels
from nodeagent.nvml import Inventory, NvmlSession
from nodeagent.nvml.fabric import GpuFabricInfo, cluster_uuid_bytes
from nodeagent.nvml.read import sysfs_bus_id

pytestmark = pytest.mark.gpu


def _fabric_by_hand(session: NvmlSession) -> set[tuple[str, int]]:
    """(cluster UUID, clique) of every GPU NVML says is registered with a fabric, as go-nvlib's
    IsFabricAttached decides it, from pynvml directly."""
    import pynvml

    found = set()
    for i in range(pynvml.nvmlDeviceGetCount()):
        dev = pynvml.nvmlDeviceGetHandleByIndex(i)
        info = GpuFabricInfo()  # nvml.h's layout (not every pynvml's)
        try:
            pynvml.nvmlDeviceGetGpuFabricInfo(dev, ctypes.byref(info))
        except pynvml.NVMLError as err:
            print(f"GPU {i}: nvmlDeviceGetGpuFabricInfo -> {err}")
            continue
        cluster = str(uuid.UUID(bytes=cluster_uuid_bytes(info)))
        print(f"GPU {i}: fabric state {info.state} status {info.status} {cluster} {info.cliqueId}")
        if info.state == 3 and info.status == 0 and int(uuid.UUID(cluster)) != 0:
            found.add((cluster, int(info.cliqueId)))
    return found


def test_the_clique_label_agrees_with_nvml(session: NvmlSession, real_inventory: Inventory) -> None:
    labels = gfd_labels(real_inventory, GfdOptions("mixed", None))
    found = _fabric_by_hand(session)
    print("gpu.clique:", labels.get("gpu.clique"))
    if len(found) == 1:
        cluster, clique = found.pop()
        assert labels["gpu.clique"] == f"{cluster}.{clique}"
    else:
        assert "gpu.clique" not in labels


def test_the_vgpu_labels_agree_with_the_config_space(real_inventory: Inventory) -> None:
    labels = gfd_labels(real_inventory, GfdOptions("mixed", None))
    spaces = []
    for gpu in real_inventory.gpus:
        path = Path("/sys/bus/pci/devices") / sysfs_bus_id(gpu.pci_bus_id) / "config"
        with open(path, "rb") as f:
            spaces.append(f.read(256))
    print("uid", os.geteuid(), "config bytes", [len(s) for s in spaces], labels.get("vgpu.present"))
    if any(len(s) < 256 for s in spaces):
        assert not any(k.startswith("vgpu.") for k in labels)  # not root: nothing said
        return
    # A bare-metal or pass-through GPU has no "VF"-signed vendor capability: present=false.
    assert labels["vgpu.present"] == ("true" if real_inventory.vgpu else "false")
    assert labels["vgpu.present"] == "false", "the lent H200 is no vGPU"
