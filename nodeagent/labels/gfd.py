"""GPU Feature Discovery's labels, value for value. Pure.

Learnt from NVIDIA/k8s-device-plugin `internal/lm/*.go` (GFD) and go-nvlib's MIG profile naming
at the commits named in tests/fixtures/upstream/README.md. Keys here have no prefix; the caller
adds it (`nvidia.com/` by default). Where GFD's outcome is left to chance (Go map order on a node
with two GPU models) the choice made here is one GFD can make, and is always the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from nodeagent.labels.platform import clique_labels, vgpu_labels
from nodeagent.labels.replication import UNSHARED, Replication, ResourceSharing, sharing_of
from nodeagent.nvml.inventory import Engines, Gpu, Inventory, MigAttributes, Slice

STRATEGIES = ("none", "single", "mixed")
PCI_CLASS_VGA = 0x030000  # a VGA controller: GFD's gpu.mode=graphics
PCI_CLASS_3D = 0x030200  # a 3D controller: gpu.mode=compute
MACHINE_UNKNOWN = "unknown"
MIB = 1024 * 1024
GIB = 1024 * MIB

_SANITISE_DROP = re.compile(r"[^A-Za-z0-9\-_. ]")
_NOT_ALNUM_ENDS = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_GI_NAME = re.compile(r"(\d+)g\.(\d+)gb(.*)$")


@dataclass(frozen=True)
class GfdOptions:
    """GFD's flags that shape the labels: --mig-strategy and what its --machine-type-file held
    (None: the file could not be read)."""

    mig_strategy: str = "mixed"
    machine_type: str | None = None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance) as GFD sees it."""

    gpu: Gpu
    name: str  # GFD's resource name: 1g.18gb, 1g.18gb.me, 1c.3g.71gb
    attributes: MigAttributes


def sanitise(text: str) -> str:
    """GFD's sanitise(): drop characters outside [A-Za-z0-9-_. ], join the words with '-'."""
    return "-".join(_SANITISE_DROP.sub("", text).split())


def label_value(text: str) -> str:
    """A value the API server accepts. GFD's values already are, except a sanitised text longer
    than 63 characters or with non-alphanumeric ends (a DMI product name such as 'Foo Inc.'):
    NFD drops such a label and a Node patch carrying it fails whole, so it is trimmed."""
    return _NOT_ALNUM_ENDS.sub("", text[:63])


def family(major: int, minor: int) -> str:
    """GFD's gpu.family, from the CUDA compute capability (not NVML's architecture)."""
    names = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    names |= {10: "blackwell", 12: "blackwell", 13: "rubin"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return names.get(major, "undefined")


def version_labels(driver_version: str, cuda_driver_version: int) -> dict[str, str]:
    """cuda.driver-version.* carry the driver's version (580.159.04), cuda.runtime-version.* the
    CUDA driver API version NVML reports (13000 is 13.0), plus GFD's deprecated names. A driver
    version not of the form X.Y[.Z] gets no driver labels (GFD would refuse to label at all)."""
    major, minor = cuda_driver_version // 1000, cuda_driver_version % 1000 // 10
    labels = {
        "cuda.runtime.major": str(major),
        "cuda.runtime.minor": str(minor),
        "cuda.runtime-version.major": str(major),
        "cuda.runtime-version.minor": str(minor),
        "cuda.runtime-version.full": f"{major}.{minor}",
    }
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3:
        return labels
    revision = parts[2] if len(parts) == 3 else ""
    labels |= {
        "cuda.driver.major": label_value(parts[0]),
        "cuda.driver.minor": label_value(parts[1]),
        "cuda.driver.rev": label_value(revision),
        "cuda.driver-version.major": label_value(parts[0]),
        "cuda.driver-version.minor": label_value(parts[1]),
        "cuda.driver-version.revision": label_value(revision),
        "cuda.driver-version.full": label_value(driver_version),
    }
    return labels


def gpu_mode(classes: Iterable[int | None]) -> str:
    """compute (every GPU a 3D controller), graphics (every GPU a VGA controller), else unknown:
    a class that could not be read, GPUs of different classes, or another class."""
    seen = set(classes)
    if len(seen) != 1 or None in seen:
        return "unknown"
    return {PCI_CLASS_3D: "compute", PCI_CLASS_VGA: "graphics"}.get(seen.pop() or 0, "unknown")


def machine_label(machine_type: str | None) -> str:
    """gpu.machine: the machine-type file's content, trimmed and sanitised; unknown unread."""
    text = MACHINE_UNKNOWN if machine_type is None else machine_type.strip()
    return label_value(sanitise(text))


def _memory_gb(device_bytes: int, mig_mib: int) -> int:
    """go-nvlib's rounding of a MIG device's memory to the GB in its name: the device's share
    of the GPU's memory, rounded up to eighths, times the GPU's memory in whole GiB (rounded
    up), rounded half away from zero. Float arithmetic as upstream, so that names agree."""
    share = math.ceil(mig_mib * MIB / device_bytes * 8) / 8
    return math.floor(share * ((device_bytes + GIB - 1) // GIB) + 0.5)


def mig_device_name(gpu: Gpu, gi_profile: str, attributes: MigAttributes) -> str:
    """The name GFD (and the device plugin) give a MIG device: `<g>g.<gb>gb`, `<c>c.` first when
    its compute instance is smaller than its GPU instance, then the GPU instance profile's
    attributes, `+` written `.` (1g.18gb+me -> 1g.18gb.me; 1g.24gb-me stays)."""
    match = _GI_NAME.search(gi_profile)
    suffix = match.group(3) if match else ""
    if gpu.memory_total_bytes > 0:
        gb = _memory_gb(gpu.memory_total_bytes, attributes.memory_mib)
    else:
        gb = int(match.group(2)) if match else 0
    g, c = attributes.gi_slice_count, attributes.ci_slice_count
    core = f"{g}g.{gb}gb" if c == g else f"{c}c.{g}g.{gb}gb"
    return (core + suffix).replace("+", ".")


def _slice_attributes(gpu: Gpu, s: Slice) -> MigAttributes:
    """The MIG device's own attributes; without them (no handle), its GPU instance profile's."""
    if s.attributes is not None:
        return s.attributes
    p = gpu.profile_by_id(s.profile_id)
    if p is None:
        zero = Engines(0, 0, 0, 0, 0)
        return MigAttributes(s.memory_total_bytes // MIB, s.multiprocessor_count, 0, 0, zero)
    return MigAttributes(
        memory_mib=p.memory_bytes // MIB,
        multiprocessor_count=p.multiprocessor_count,
        gi_slice_count=p.slice_count,
        ci_slice_count=p.slice_count,
        engines=p.engines,
    )


def mig_devices(gpu: Gpu) -> list[MigDevice]:
    """The GPU's MIG devices: one per compute instance. A GPU instance still without one (an
    interrupted apply) is no MIG device, so it is never advertised."""
    out = []
    for s in gpu.slices:
        if s.ci_id is None:
            continue
        attributes = _slice_attributes(gpu, s)
        out.append(MigDevice(gpu, mig_device_name(gpu, s.profile, attributes), attributes))
    return out


def _shared(replication: Replication | None) -> bool:
    return replication is not None and replication.replicas > 1


def _resource(
    name: str,
    product: list[str],
    count: int,
    replication: Replication | None,
) -> dict[str, str]:
    """GFD's product, count, replicas and sharing-strategy of one resource. No replication
    (None) is GFD's "sharing disabled": replicas 0, as on MIG-enabled GPUs' gpu.* labels."""
    parts = [sanitise(p) for p in product if p]
    if _shared(replication) and not (replication is not None and replication.renamed):
        parts.append("SHARED")
    replicas = 0 if replication is None else max(replication.replicas, 1)
    strategy = replication.strategy if replication is not None and _shared(replication) else "none"
    return {
        f"{name}.product": label_value("-".join(parts)),
        f"{name}.count": str(count),
        f"{name}.replicas": str(replicas),
        f"{name}.sharing-strategy": strategy,
    }


def _attribute_labels(name: str, a: MigAttributes) -> dict[str, str]:
    return {
        f"{name}.memory": str(a.memory_mib),
        f"{name}.multiprocessors": str(a.multiprocessor_count),
        f"{name}.slices.gi": str(a.gi_slice_count),
        f"{name}.slices.ci": str(a.ci_slice_count),
        f"{name}.engines.copy": str(a.engines.copy),
        f"{name}.engines.decoder": str(a.engines.decoder),
        f"{name}.engines.encoder": str(a.engines.encoder),
        f"{name}.engines.jpeg": str(a.engines.jpeg),
        f"{name}.engines.ofa": str(a.engines.ofa),
    }


def _full_gpu(gpu: Gpu, count: int, replication: Replication | None) -> dict[str, str]:
    labels = _resource("gpu", [gpu.name], count, replication)
    memory_mib = gpu.memory_total_bytes // MIB
    if memory_mib:
        labels["gpu.memory"] = str(memory_mib)
    major, minor = gpu.compute_capability
    if major:
        labels["gpu.family"] = family(major, minor)
        labels["gpu.compute.major"] = str(major)
        labels["gpu.compute.minor"] = str(minor)
    return labels


def _gpu_labels(gpus: tuple[Gpu, ...], replication: Replication) -> dict[str, str]:
    """gpu.* of one GPU model, with the count of that model. GFD labels each model in turn,
    MIG-enabled GPUs' models (sharing disabled: replicas 0) before full GPUs' (the plugin's
    replication), each over the last; the order within each group is Go's map order, so on a
    node with two models of one kind GFD's winner is left to chance. Here the model of the
    lowest-index GPU of the last group wins, always."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    labels: dict[str, str] = {}
    for mig_enabled, rep in ((True, None), (False, replication)):
        by_name: dict[str, Gpu] = {}
        for gpu in gpus:
            if gpu.mig_current == mig_enabled:
                by_name[gpu.name] = gpu  # GFD keeps the last GPU of a model
        for name in reversed(list(by_name)):
            labels |= _full_gpu(by_name[name], counts[name], rep)
    return labels


def _invalid_single(gpu: Gpu) -> dict[str, str]:
    """GFD's answer when the single strategy cannot describe the node."""
    return {
        "gpu.product": label_value(f"{sanitise(gpu.name)}-MIG-INVALID"),
        "gpu.count": "0",
        "gpu.replicas": "0",
        "gpu.sharing-strategy": "",
        "gpu.memory": "0",
    }


def _single(gpus: tuple[Gpu, ...], replication: Replication) -> dict[str, str]:
    """The single strategy: every GPU's MIG devices are one profile, advertised as gpu.*. No
    MIG-enabled GPU: nothing changes. Invalid (product `<model>-MIG-INVALID`, count 0) when a
    MIG-enabled GPU has no MIG device, a GPU is not MIG-enabled, or profiles differ."""
    enabled = [g for g in gpus if g.mig_current]
    if not enabled:
        return {}
    devices = [mig_devices(g) for g in enabled]
    if any(not d for d in devices) or len(enabled) != len(gpus):
        return _invalid_single(enabled[0])
    every = [d for per_gpu in devices for d in per_gpu]
    if len({d.name for d in every}) != 1:
        return _invalid_single(enabled[0])
    first = every[0]
    labels = _resource("gpu", [first.gpu.name, "MIG", first.name], len(every), replication)
    return labels | _attribute_labels("gpu", first.attributes)


def _mixed(gpus: tuple[Gpu, ...], sharing: Replication | ResourceSharing) -> dict[str, str]:
    """The mixed strategy: mig-<name>.* per MIG device name, from its first device, shared as
    the plugin config shares the resource nvidia.com/mig-<name>."""
    found: dict[str, tuple[MigDevice, int]] = {}
    for gpu in gpus:
        if not gpu.mig_current:
            continue
        for d in mig_devices(gpu):
            first, count = found.get(d.name, (d, 0))
            found[d.name] = (first, count + 1)
    labels: dict[str, str] = {}
    for name, (d, count) in found.items():
        base = f"mig-{name}"
        rep = sharing_of(sharing, base)
        labels |= _resource(base, [d.gpu.name, "MIG", d.name], count, rep)
        labels |= _attribute_labels(base, d.attributes)
    return labels


def gfd_labels(
    inventory: Inventory,
    options: GfdOptions = GfdOptions(),
    replication: Replication | ResourceSharing = UNSHARED,
    mps_capable: bool = False,
) -> dict[str, str]:
    """Every label GFD would publish for the node (keys without prefix), except gfd.timestamp
    (it would change the Node at every reconcile). No GPU: none.
    Raises ValueError for a MIG strategy other than none, single, mixed."""
    if options.mig_strategy not in STRATEGIES:
        raise ValueError(f"unknown MIG strategy {options.mig_strategy!r}")
    gpus = inventory.gpus
    if not gpus:
        return {}
    labels = {"gpu.machine": machine_label(options.machine_type)}
    labels |= version_labels(inventory.driver_version, inventory.cuda_driver_version)
    labels["mig.capable"] = "true" if any(g.mig_capable for g in gpus) else "false"
    labels["mps.capable"] = "true" if mps_capable else "false"
    full = sharing_of(replication, "gpu")
    labels |= _gpu_labels(gpus, full)
    if options.mig_strategy == "single":
        labels |= {"mig.strategy": "single"} | _single(gpus, full)
    elif options.mig_strategy == "mixed":
        labels |= {"mig.strategy": "mixed"} | _mixed(gpus, replication)
    labels["gpu.mode"] = gpu_mode(g.pci_class for g in gpus)
    vgpu = {k: label_value(v) for k, v in vgpu_labels(inventory.vgpu).items()}  # host's bytes
    return labels | clique_labels(gpus) | vgpu
