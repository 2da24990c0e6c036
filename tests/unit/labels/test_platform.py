"""gpu.clique (NVLink fabric) and vgpu.* labels: from NVML on the emulator and from GFD's own
recorded PCI config spaces; absent where nothing reports them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nodeagent.labels.platform import clique_labels, vgpu_labels
from nodeagent.labels.render import render_labels
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import Fabric, Gpu, VgpuDevice
from nodeagent.nvml.vgpu import parse_config_space, vendor_capability
from nodeagent.sim import SimulatedNvml, parse_spec

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/upstream/k8s-device-plugin"
P = "nvidia.com/"
CLUSTER = "00000001-0000-0000-0000-000000000001"  # the real GB200's (anonymised) cluster
ZERO = "00000000-0000-0000-0000-000000000000"


def config_space(name: str) -> bytes:
    """GFD's recorded config space (internal/vgpu/pciutil.go), kept as hex text."""
    text = (UPSTREAM / f"internal/vgpu/{name}-config-space.hex").read_text()
    return bytes.fromhex(" ".join(line for line in text.splitlines() if not line.startswith("#")))


def emulated(spec: str, spaces: dict[int, bytes] | None = None) -> dict[str, str]:
    lib = SimulatedNvml(parse_spec(spec))
    for index, data in (spaces or {}).items():
        lib.set_pci_config_space(index, data)
    return render_labels(read_inventory(NvmlSession(lib)))


# GFD's tests of the same bytes (internal/vgpu/vgpu_test.go, 1b826acc): the pass-through GPU's
# vendor capability is 20 bytes and no vGPU; the vGPU's is 27, host driver 460.16 / r460_00.
def test_gfds_recorded_config_spaces() -> None:
    passthrough, vgpu = config_space("passthrough"), config_space("vgpu")
    cap = vendor_capability(passthrough)
    assert cap is not None and len(cap) == 20
    assert parse_config_space("00000000:01:00.0", passthrough) is None
    cap = vendor_capability(vgpu)
    assert cap is not None and len(cap) == 27 and cap[0] == 9
    assert parse_config_space("00000000:02:00.0", vgpu) == VgpuDevice(
        "00000000:02:00.0", "460.16", "r460_00"
    )


def test_a_vgpu_guest_is_labelled_as_gfd_does() -> None:
    labels = emulated("a100-40gbx2", {0: config_space("passthrough"), 1: config_space("vgpu")})
    assert labels[P + "vgpu.present"] == "true"
    assert labels[P + "vgpu.host-driver-version"] == "460.16"
    assert labels[P + "vgpu.host-driver-branch"] == "r460_00"


def test_no_vgpu_among_readable_gpus_is_present_false() -> None:
    labels = emulated("a100-40gb", {0: config_space("passthrough")})
    assert labels[P + "vgpu.present"] == "false"
    assert P + "vgpu.host-driver-version" not in labels


@pytest.mark.parametrize(
    "spaces",
    [
        {},  # the emulator's default: no config space (as sysfs unread)
        {0: config_space("vgpu")[:64]},  # 64 bytes: what a non-root reader gets
        {0: config_space("vgpu")},  # one GPU of two unreadable: nothing said (GFD: an error)
    ],
)
def test_no_vgpu_label_where_the_config_space_is_not_read_whole(spaces: dict[int, bytes]) -> None:
    assert not any("vgpu" in k for k in emulated("a100-40gbx2", spaces))


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:6] + bytes([b[6] & ~0x10]) + b[7:],  # no capability list
        lambda b: b[:0x34] + b"\x40" + b[0x35:0x41] + b"\x40" + b[0x42:],  # a list that loops
    ],
)
def test_a_broken_capability_list_is_no_vgpu(damage: object) -> None:
    data = damage(config_space("vgpu"))  # type: ignore[operator]
    assert len(data) == 256
    assert parse_config_space("x", data) is None


def test_the_emulated_gb200_is_in_its_clique() -> None:
    labels = emulated("gb200x4")
    assert labels[P + "gpu.clique"] == f"{CLUSTER}.2"


@pytest.mark.parametrize("spec", ["h200", "b200x2", "a100-40gb"])
def test_no_clique_where_nvml_reports_no_fabric(spec: str) -> None:
    assert P + "gpu.clique" not in emulated(spec)


def _gpu(fabric: Fabric | None) -> Gpu:
    lib = SimulatedNvml(parse_spec("h200"))
    return dataclasses.replace(read_inventory(NvmlSession(lib)).gpus[0], fabric=fabric)


# go-nvlib's IsFabricAttached and GFD's getFabricIDs (internal/lm/imex.go).
@pytest.mark.parametrize(
    ("fabrics", "clique"),
    [
        ([Fabric(3, 0, CLUSTER, 2)] * 2, f"{CLUSTER}.2"),
        ([Fabric(2, 0, CLUSTER, 2)], None),  # in progress
        ([Fabric(1, 0, CLUSTER, 2)], None),  # not started
        ([Fabric(3, 999, CLUSTER, 2)], None),  # completed, failed
        ([Fabric(3, 0, ZERO, 2)], None),  # in no cluster (an HGX H100/H200)
        ([Fabric(3, 0, CLUSTER, 2), Fabric(3, 0, CLUSTER, 3)], None),  # cliques differ
        ([Fabric(3, 0, CLUSTER, 2), Fabric(3, 0, ZERO.replace("0", "2"), 2)], None),
        ([Fabric(3, 0, CLUSTER, 2), None, Fabric(2, 0, CLUSTER, 7)], f"{CLUSTER}.2"),
        ([None], None),
    ],
)
def test_clique_rules(fabrics: list[Fabric | None], clique: str | None) -> None:
    labels = clique_labels([_gpu(f) for f in fabrics])
    assert labels == ({"gpu.clique": clique} if clique else {})


def test_vgpu_labels_of_nothing_read() -> None:
    assert vgpu_labels(None) == {}
    assert vgpu_labels(()) == {"vgpu.present": "false"}
