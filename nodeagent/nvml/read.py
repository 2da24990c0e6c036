"""Read the node's GPUs through NVML into one immutable Inventory."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import read_input
from nodeagent.nvml.codes import FUNCTION_NOT_FOUND, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED
from nodeagent.nvml.fabric import read_fabric
from nodeagent.nvml.inventory import (
    ARCHITECTURES,
    Engines,
    GiProfile,
    Gpu,
    Inventory,
    MigAttributes,
    Placement,
    Process,
    Slice,
)
from nodeagent.nvml.session import NvmlSession
from nodeagent.nvml.vgpu import read_vgpus

MIB = 1024 * 1024
PROFILE_CONSTANT_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_COUNT
CI_PROFILE_CONSTANT_COUNT = 9  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT
_ARRAY_SIZE = 32  # more than any profile's placements or instances
# A profile constant the GPU does not offer answers one of these (seen on the real H200).
_PROBE_ABSENT = (NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _profile_name(raw: Any) -> str:
    """NVML names profiles b'MIG 1g.18gb'; configs and labels use '1g.18gb'."""
    return _text(raw).removeprefix("MIG ").strip()


def read_profiles(session: NvmlSession, dev: Any, index: int, uuid: str) -> tuple[GiProfile, ...]:
    """Every GPU-instance profile the GPU offers (readable with MIG disabled), read once per
    GPU UUID and session: the table is the hardware's and the driver's, fixed while NVML is
    loaded (25 NVML calls an H200 saved on every inventory read).

    Loops over the NVML_GPU_INSTANCE_PROFILE_* constants: they only select a profile; the
    returned `info.id` is what placement, capacity and create calls take.
    nvidia-smi equivalent: `nvidia-smi mig -i N -lgip` and `-lgipp`.
    """
    with session.lock:
        key = ("gi-profiles", uuid)
        if key not in session.static:
            session.static[key] = _read_profiles(session, dev, index)
        return session.static[key]  # type: ignore[no-any-return]


def _read_profiles(session: NvmlSession, dev: Any, index: int) -> tuple[GiProfile, ...]:
    lib = session.lib
    profiles: dict[int, GiProfile] = {}
    for constant in range(PROFILE_CONSTANT_COUNT):
        info = session.call(
            "nvmlDeviceGetGpuInstanceProfileInfo", dev, constant, absent=_PROBE_ABSENT
        )
        if info is None or info.instanceCount == 0 or info.id in profiles:
            continue
        placements = (lib.c_nvmlGpuInstancePlacement_t * _ARRAY_SIZE)()
        count = ctypes.c_uint(_ARRAY_SIZE)
        session.call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            dev,
            info.id,
            placements,
            ctypes.byref(count),
            context=f"GPU {index}",
        )
        profiles[int(info.id)] = GiProfile(
            id=int(info.id),
            name=_profile_name(info.name),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessor_count=int(info.multiprocessorCount),
            memory_bytes=int(info.memorySizeMB) * MIB,
            engines=Engines(
                copy=int(info.copyEngineCount),
                decoder=int(info.decoderCount),
                encoder=int(info.encoderCount),
                jpeg=int(info.jpegCount),
                ofa=int(info.ofaCount),
            ),
            placements=tuple(
                Placement(int(placements[i].start), int(placements[i].size))
                for i in range(count.value)
            ),
        )
    return tuple(sorted(profiles.values(), key=lambda p: (p.slice_count, p.memory_bytes, p.name)))


def _processes(session: NvmlSession, handle: Any) -> tuple[Process, ...]:
    procs = session.read("nvmlDeviceGetComputeRunningProcesses", handle) or []
    return tuple(
        Process(
            pid=int(p.pid),
            memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
        )
        for p in procs
    )


def _gpu_instances(session: NvmlSession, dev: Any, profile: GiProfile) -> list[Any]:
    lib = session.lib
    arr = (lib.c_nvmlGpuInstance_t * _ARRAY_SIZE)()
    count = ctypes.c_uint(0)
    session.call("nvmlDeviceGetGpuInstances", dev, profile.id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def _ci_profiles(session: NvmlSession, gi: Any, key: Any) -> list[tuple[int, int]]:
    """(CI profile id, compute slices) of each CI profile a GI offers, read once per GPU and
    GI profile (`key`): a fixed table, like the GI profiles."""
    if key in session.static:
        return session.static[key]  # type: ignore[no-any-return]
    lib = session.lib
    found: dict[int, int] = {}
    for constant in range(CI_PROFILE_CONSTANT_COUNT):
        info = session.call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gi,
            constant,
            lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            absent=_PROBE_ABSENT,
        )
        if info is not None and int(info.id) not in found:
            found[int(info.id)] = int(info.sliceCount)
    session.static[key] = list(found.items())
    return session.static[key]  # type: ignore[no-any-return]


def _compute_instances(session: NvmlSession, gi: Any, key: Any) -> list[tuple[Any, int]]:
    """Every CI in a GI with its compute slices, over each CI profile the GI offers."""
    lib = session.lib
    found: list[tuple[Any, int]] = []
    for profile_id, slice_count in _ci_profiles(session, gi, key):
        arr = (lib.c_nvmlComputeInstance_t * _ARRAY_SIZE)()
        count = ctypes.c_uint(0)
        session.call("nvmlGpuInstanceGetComputeInstances", gi, profile_id, arr, ctypes.byref(count))
        found.extend(
            (session.call("nvmlComputeInstanceGetInfo", arr[i]), slice_count)
            for i in range(count.value)
        )
    return found


def _mig_devices(session: NvmlSession, dev: Any) -> dict[tuple[int, int], Any]:
    """MIG device handles by (gi_id, ci_id). Empty indices answer NOT_FOUND."""
    devices = {}
    for i in range(int(session.call("nvmlDeviceGetMaxMigDeviceCount", dev))):
        mig = session.call("nvmlDeviceGetMigDeviceHandleByIndex", dev, i, absent=(NOT_FOUND,))
        if mig is None:
            continue
        if not bool(session.call("nvmlDeviceIsMigDeviceHandle", mig)):
            continue
        gi_id = int(session.call("nvmlDeviceGetGpuInstanceId", mig))
        ci_id = int(session.call("nvmlDeviceGetComputeInstanceId", mig))
        devices[(gi_id, ci_id)] = mig
    return devices


def read_slices(
    session: NvmlSession, dev: Any, index: int, profiles: tuple[GiProfile, ...], uuid: str
) -> tuple[Slice, ...]:
    """The GPU's GPU instances with their compute instances (MIG enabled only; the caller
    holds the session's lock, as read_inventory does).

    nvidia-smi equivalent: `nvidia-smi mig -i N -lgi` and `-lci`.
    """
    migs = _mig_devices(session, dev)
    slices = []
    for profile in profiles:
        for gi in _gpu_instances(session, dev, profile):
            gi_info = session.call("nvmlGpuInstanceGetInfo", gi)
            # Without a MIG device (no CI yet) the slice shows its profile's size, no use.
            bare = Slice(
                gpu_index=index,
                gi_id=int(gi_info.id),
                ci_id=None,
                profile_id=profile.id,
                profile=profile.name,
                placement=Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
                mig_uuid=None,
                memory_total_bytes=profile.memory_bytes,
                memory_used_bytes=0,
                multiprocessor_count=profile.multiprocessor_count,
                processes=(),
            )
            cis = _compute_instances(session, gi, ("ci-profiles", uuid, profile.id))
            if not cis:
                slices.append(bare)
            for ci, ci_slices in cis:
                bare_ci = replace(bare, ci_slice_count=ci_slices, ci_start=int(ci.placement.start))
                slices.append(_with_mig_device(session, bare_ci, int(ci.id), migs))
    return tuple(sorted(slices, key=lambda s: (s.placement.start, s.gi_id, s.ci_id or 0)))


def _with_mig_device(
    session: NvmlSession, bare: Slice, ci_id: int, migs: dict[tuple[int, int], Any]
) -> Slice:
    """The slice of CI `ci_id`, filled from its MIG device handle (UUID, memory, processes)."""
    mig = migs.get((bare.gi_id, ci_id))
    if mig is None:
        return replace(bare, ci_id=ci_id)
    mem = session.call("nvmlDeviceGetMemoryInfo", mig)
    uuid = _text(session.call("nvmlDeviceGetUUID", mig))
    attrs = _mig_attributes(session, mig, uuid)
    return replace(
        bare,
        ci_id=ci_id,
        mig_uuid=uuid,
        memory_total_bytes=int(mem.total),
        memory_used_bytes=int(mem.used),
        multiprocessor_count=(
            attrs.multiprocessor_count if attrs is not None else bare.multiprocessor_count
        ),
        processes=_processes(session, mig),
        attributes=attrs,
    )


MAX_KEPT_ATTRIBUTES = 4096  # MIG devices' attributes kept; more (months of changes): read again


def _mig_attributes(session: NvmlSession, mig: Any, uuid: str) -> MigAttributes | None:
    """The MIG device's attributes, read once per MIG UUID: a UUID names one MIG device for
    its life, and its size does not change (56 NVML calls fewer a refresh at 56 slices)."""
    kept: dict[str, MigAttributes | None] = session.static.setdefault("mig-attributes", {})
    if uuid not in kept:
        if len(kept) >= MAX_KEPT_ATTRIBUTES:
            kept.clear()
        kept[uuid] = _attributes(session.read("nvmlDeviceGetAttributes", mig))
    return kept[uuid]


def _attributes(attrs: Any) -> MigAttributes | None:
    if attrs is None:
        return None
    return MigAttributes(
        memory_mib=int(attrs.memorySizeMB),
        multiprocessor_count=int(attrs.multiprocessorCount),
        gi_slice_count=int(attrs.gpuInstanceSliceCount),
        ci_slice_count=int(attrs.computeInstanceSliceCount),
        engines=Engines(
            copy=int(attrs.sharedCopyEngineCount),
            decoder=int(attrs.sharedDecoderCount),
            encoder=int(attrs.sharedEncoderCount),
            jpeg=int(attrs.sharedJpegCount),
            ofa=int(attrs.sharedOfaCount),
        ),
    )


SYSFS = Path("/sys")
NVIDIA_PCI_VENDOR = 0x10DE
SYSFS_ID_BYTES = 64  # "0x10de\n"


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's bus id ('00000000:18:00.0') as sysfs names the device ('0000:18:00.0')."""
    bus_id = nvml_bus_id.lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        return f"{domain[4:]}:{rest}"
    return bus_id


def read_pci_class(session: NvmlSession, dev: Any, bus_id: str, sysfs: Path = SYSFS) -> int | None:
    """The GPU's 24-bit PCI class code (0x030200 a 3D controller, 0x030000 a VGA controller),
    or None when neither NVML nor sysfs tells.

    NVML's nvmlDeviceGetPciInfoExt gives base class and subclass; an older driver lacks it, and
    then the code comes from `<sysfs>/bus/pci/devices/<bus id>/class`, where GPU Feature
    Discovery reads it. nvidia-smi equivalent: `lspci -n -s <bus id>`.
    """
    lib = session.lib
    if hasattr(lib, "nvmlDeviceGetPciInfoExt"):  # nvidia-ml-py from 12.550
        info = lib.nvmlPciInfoExt_v1_t()
        info.version = lib.nvmlPciInfoExt_v1
        # pynvml returns None either way; an answer fills the base class (3 for a GPU).
        session.call(
            "nvmlDeviceGetPciInfoExt",
            dev,
            ctypes.byref(info),
            absent=(NOT_SUPPORTED, FUNCTION_NOT_FOUND),
        )
        if info.baseClass:
            return (int(info.baseClass) << 16) | (int(info.subClass) << 8)
    device = sysfs / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id)
    try:
        vendor = int(read_input(device / "vendor", "PCI vendor id", SYSFS_ID_BYTES), 0)
        code = int(read_input(device / "class", "PCI class", SYSFS_ID_BYTES), 0)
    except (ConfigError, ValueError):
        return None
    return code if vendor == NVIDIA_PCI_VENDOR else None


@dataclass(frozen=True)
class _Identity:
    """What NVML says of a GPU that cannot change while NVML is loaded."""

    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    pci_device_id: int
    pci_subsystem_id: int
    pci_class: int | None
    compute_capability: tuple[int, int]
    architecture: str


def _identity(session: NvmlSession, index: int, sysfs: Path) -> _Identity:
    """The GPU's handle, UUID, name, PCI ids and class, compute capability and architecture,
    read once per session (the caller holds its lock): 7 NVML calls a GPU fewer on every
    inventory read."""
    key = ("gpu-identity", index, sysfs)
    found = session.static.get(key)
    if found is None:
        dev = session.call("nvmlDeviceGetHandleByIndex", index, context=f"GPU {index}")
        pci = session.call("nvmlDeviceGetPciInfo", dev)
        arch = session.read("nvmlDeviceGetArchitecture", dev)
        major, minor = session.call("nvmlDeviceGetCudaComputeCapability", dev)
        found = session.static[key] = _Identity(
            handle=dev,
            uuid=_text(session.call("nvmlDeviceGetUUID", dev)),
            name=_text(session.call("nvmlDeviceGetName", dev)),
            pci_bus_id=_text(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            pci_subsystem_id=int(pci.pciSubSystemId),
            pci_class=read_pci_class(session, dev, _text(pci.busId), sysfs),
            compute_capability=(int(major), int(minor)),
            architecture=ARCHITECTURES.get(int(arch), "unknown") if arch is not None else "unknown",
        )
    return found


def read_gpu(session: NvmlSession, index: int, sysfs: Path = SYSFS) -> Gpu:
    """One GPU: identity, memory, MIG mode, profiles, slices, processes."""
    with session.lock:
        ident = _identity(session, index, sysfs)
        dev = ident.handle
        mem = session.call("nvmlDeviceGetMemoryInfo", dev)
        mode = session.read("nvmlDeviceGetMigMode", dev)
        mig_capable = mode is not None
        current, pending = (bool(mode[0]), bool(mode[1])) if mode is not None else (False, False)
        profiles = read_profiles(session, dev, index, ident.uuid) if mig_capable else ()
        slots = max((p.start + p.size for pr in profiles for p in pr.placements), default=0)
        return Gpu(
            index=index,
            uuid=ident.uuid,
            name=ident.name,
            pci_bus_id=ident.pci_bus_id,
            pci_device_id=ident.pci_device_id,
            memory_total_bytes=int(mem.total),
            memory_used_bytes=int(mem.used),
            memory_free_bytes=int(mem.free),
            compute_capability=ident.compute_capability,
            architecture=ident.architecture,
            mig_capable=mig_capable,
            mig_current=current,
            mig_pending=pending,
            memory_slice_count=slots,
            profiles=profiles,
            slices=read_slices(session, dev, index, profiles, ident.uuid) if current else (),
            processes=() if current else _processes(session, dev),
            pci_subsystem_id=ident.pci_subsystem_id,
            pci_class=ident.pci_class,
            fabric=read_fabric(session, dev, ident.uuid),
        )


def read_inventory(session: NvmlSession, sysfs: Path = SYSFS) -> Inventory:
    """The whole node as one immutable snapshot. `sysfs` is where PCI class codes are read
    when NVML cannot give them (tests point it elsewhere).

    nvidia-smi equivalent: `nvidia-smi -q` plus `nvidia-smi mig -lgip/-lgipp/-lgi/-lci`.
    """
    with session.lock:  # one consistent state, and the profile tables' cache
        return _read_inventory(session, sysfs)


def _read_inventory(session: NvmlSession, sysfs: Path) -> Inventory:
    count = int(session.call("nvmlDeviceGetCount"))
    gpus = tuple(read_gpu(session, i, sysfs) for i in range(count))
    return Inventory(
        driver_version=_text(session.call("nvmlSystemGetDriverVersion")),
        cuda_driver_version=int(session.call("nvmlSystemGetCudaDriverVersion")),
        gpus=gpus,
        vgpu=read_vgpus(
            session,
            tuple(g.pci_bus_id for g in gpus),
            lambda bus: sysfs / "bus" / "pci" / "devices" / sysfs_bus_id(bus),
        ),
    )
