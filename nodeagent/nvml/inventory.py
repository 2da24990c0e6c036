"""The Inventory: one immutable snapshot of what NVML reports about the node's GPUs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}


@dataclass(frozen=True)
class Placement:
    """Where a GPU instance sits: `size` memory slices from `start`."""

    start: int
    size: int

    def slots(self) -> range:
        return range(self.start, self.start + self.size)

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class Engines:
    copy: int
    decoder: int
    encoder: int
    jpeg: int
    ofa: int


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile. `id` is NVML's profile id (not a PROFILE_* constant)."""

    id: int
    name: str  # as NVIDIA writes it in configs: "1g.18gb", "1g.18gb+me"
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    memory_bytes: int
    engines: Engines
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class Process:
    pid: int
    memory_bytes: int | None


@dataclass(frozen=True)
class MigAttributes:
    """What NVML says of one MIG device (nvmlDeviceGetAttributes on its handle): the numbers
    GFD publishes per MIG profile."""

    memory_mib: int  # memorySizeMB
    multiprocessor_count: int
    gi_slice_count: int
    ci_slice_count: int
    engines: Engines  # the shared copy, decoder, encoder, JPEG and OFA engines


@dataclass(frozen=True)
class Slice:
    """One GPU instance and its compute instance (a MIG device). A GI left without a CI
    (a crash between the two creates) has `ci_id`, `mig_uuid` None."""

    gpu_index: int
    gi_id: int
    ci_id: int | None
    profile_id: int
    profile: str
    placement: Placement
    mig_uuid: str | None
    memory_total_bytes: int
    memory_used_bytes: int
    multiprocessor_count: int
    processes: tuple[Process, ...]
    # The compute instance: its compute slices and start inside the GI. None (no CI, or a CI
    # profile NVML did not describe) counts as the full GI.
    ci_slice_count: int | None = None
    ci_start: int = 0
    attributes: MigAttributes | None = None  # None without a MIG device handle

    @property
    def in_use(self) -> bool:
        return bool(self.processes)

    @property
    def gi_slice_count(self) -> int:
        """Compute slices of the GI, from its profile name ('3g.40gb' -> 3)."""
        head = self.profile.split("g.", 1)[0]
        return int(head) if head.isdigit() else 0

    @property
    def device_profile(self) -> str:
        """The MIG device's profile as NVIDIA names it: '3g.40gb', or '1c.3g.40gb' for a
        compute instance smaller than its GI."""
        c = self.ci_slice_count
        if c is None or c == self.gi_slice_count:
            return self.profile
        return f"{c}c.{self.profile}"


@dataclass(frozen=True)
class Fabric:
    """What NVML says of the GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfo): its state
    (NVML_GPU_FABRIC_STATE_*: 3 completed), the status of the registration (an NVML return
    code, 0 success), the cluster's UUID and the clique the GPU belongs to."""

    state: int
    status: int
    cluster_uuid: str  # 8-4-4-4-12 hex; all zeros when the GPU is in no cluster
    clique_id: int

    @property
    def attached(self) -> bool:
        """Registered with the fabric (go-nvlib's IsFabricAttached): completed, successfully,
        in a cluster."""
        return self.state == 3 and self.status == 0 and self.cluster_uuid != ZERO_UUID


ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class VgpuDevice:
    """A vGPU seen from the guest: its PCI address and what the vGPU manager on the hypervisor
    host says of itself in the device's PCI config space (None where the record is absent)."""

    pci_bus_id: str
    host_driver_version: str | None
    host_driver_branch: str | None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    compute_capability: tuple[int, int]
    architecture: str
    mig_capable: bool
    mig_current: bool
    mig_pending: bool
    memory_slice_count: int
    profiles: tuple[GiProfile, ...]
    slices: tuple[Slice, ...]
    processes: tuple[Process, ...]  # on the full GPU (MIG disabled)
    pci_subsystem_id: int = 0  # device << 16 | vendor of the board; 0 when unknown
    pci_class: int | None = None  # PCI class code, 0x030200 a 3D controller; None: unknown
    fabric: Fabric | None = None  # None: NVML reports no fabric for this GPU

    def profile_named(self, name: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_driver_version: int  # as NVML gives it: 13000 is CUDA 13.0
    gpus: tuple[Gpu, ...]
    # The vGPUs among the GPUs' PCI devices (empty: none is one); None where their PCI config
    # space could not be read in full (nodeagent.nvml.vgpu).
    vgpu: tuple[VgpuDevice, ...] | None = None

    @property
    def cuda_version(self) -> str:
        v = self.cuda_driver_version
        return f"{v // 1000}.{v % 1000 // 10}"

    def to_dict(self) -> dict[str, Any]:
        """The whole snapshot as JSON-ready data (`nodeagent status --output json`)."""
        data = asdict(self)
        data["cuda_version"] = self.cuda_version
        for gpu, raw in zip(self.gpus, data["gpus"], strict=True):
            raw["pci_device_id"] = f"0x{gpu.pci_device_id:08X}"
            for s, rs in zip(gpu.slices, raw["slices"], strict=True):
                rs["in_use"] = s.in_use
        return data
