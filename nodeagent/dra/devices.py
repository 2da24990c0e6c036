"""The node's GPUs as DRA devices (resource.k8s.io/v1 ResourceSlices), as KEP-4815 models
partitionable devices. Pure.

Every GPU is one device; every placement of every MIG profile is one more, which consumes
counters from its GPU's counter set: one counter per memory slice (`memory-slice-N`, value 1)
and one per capacity (memory, multiprocessors, engines). The whole GPU consumes them all, so
the scheduler never hands out a GPU and one of its slices, nor two overlapping slices. This is
what NVIDIA's DRA driver publishes (NVIDIA/k8s-dra-driver-gpu@22407113785e:
cmd/gpu-kubelet-plugin/partitions.go, mig.go): the same device names, counter names and
capacity names, so DeviceClass selectors carry over.

resource.k8s.io/v1 (kubernetes/api@10b39a39bcee: resource/v1/types.go) puts a pool's counter
sets and its devices in different ResourceSlices ("only one of Devices and SharedCounters can
be set"), at most 8 counter sets per slice and 64 devices per slice that consumes counters:
one counters slice per 8 GPUs, then one devices slice per GPU (an H200 has 26 devices).

MPS shares (KEP-5075 consumable capacity, `dra.mps-shares`): beside a GPU (and, with `mig`,
beside each MIG placement) a share device `<name>-mps` with `allowMultipleAllocations` and two
capacities the scheduler hands out per claim, `<driver>/sm` (percent) and `<driver>/memory`
(bytes). It consumes the same counters as its exclusive twin: kube-scheduler v1.36 takes a
multi-allocatable device's counters once, for its first allocation, so while any share is
allocated neither the twin nor an overlapping slice can be, and the other way round.

A MIG placement that is not made yet can carry binding conditions (KEP-5007, the
DRADeviceBindingConditions gate; resource.k8s.io/v1 Device.bindingConditions and
bindingFailureConditions, at most 4 each, set together or not at all): the scheduler copies them
into the claim's allocation result and waits in PreBind until the driver sets
`<driver>/SliceReady` True in the claim's status.devices (nodeagent.dra.k8s.binding), or fails the
binding when `<driver>/SliceFailed` is True. A device that exists carries none. `bindsToNode`
is not set: it pins a network-attached device's allocation to the chosen node, and these
devices are in a ResourceSlice of one node already.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from nodeagent.dra.capacity import share_device
from nodeagent.nvml.inventory import GiProfile, Gpu, Inventory, Placement

MAX_COUNTER_SETS_PER_SLICE = 8
MAX_DEVICES_PER_SLICE = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
SLICE_READY = "SliceReady"  # binding condition types, each prefixed with the driver's name
SLICE_FAILED = "SliceFailed"
# Each number as this driver writes it: ASCII digits, no leading zero, a bounded count (a name
# read with \d or $ takes an Arabic-Indic zero and 'gpu-0\n': other names for GPU 0); read with
# fullmatch.
_N = "(0|[1-9][0-9]{0,8})"
MIG_NAME = re.compile(rf"gpu-{_N}-mig-[a-z0-9-]+-{_N}-{_N}(-mps)?")
GPU_NAME = re.compile(rf"gpu-{_N}(-mps)?")
SHARES = ("none", "gpus", "mig")  # dra.mps-shares: which devices have a share device
CAPACITIES = (  # (capacity name, counter name)
    ("memory", "memory"),
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
)


@dataclass(frozen=True)
class DeviceRef:
    """What a device name stands for: a whole GPU, or a MIG profile at a placement."""

    gpu: int
    profile_id: int | None = None
    start: int | None = None
    shared: bool = False  # its MPS share device (nodeagent.dra.capacity)

    @property
    def is_mig(self) -> bool:
        return self.profile_id is not None


@dataclass(frozen=True)
class SliceSpec:
    """One ResourceSlice this node should have: its name and spec, without the pool's
    generation and slice count (the publisher sets those)."""

    name: str
    spec: dict[str, Any]


def dns_label(text: str) -> str:
    """Lower case, anything outside [a-z0-9-] becomes '-', no '-' at either end."""
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")


def gpu_device_name(gpu: int) -> str:
    return f"gpu-{gpu}"


def mig_device_name(gpu: int, profile: GiProfile, start: int) -> str:
    """'gpu-0-mig-1g18gb-19-0': GPU, profile (dots dropped), profile id, placement start."""
    return f"gpu-{gpu}-mig-{dns_label(profile.name.replace('.', ''))}-{profile.id}-{start}"


def binding_conditions(driver: str) -> dict[str, list[str]]:
    """The fields a MIG device not made yet carries: the condition the scheduler waits for, and
    the one that fails the binding."""
    return {
        "bindingConditions": [f"{driver}/{SLICE_READY}"],
        "bindingFailureConditions": [f"{driver}/{SLICE_FAILED}"],
    }


def counter_set_name(gpu: int) -> str:
    return f"gpu-{gpu}-counter-set"


def parse_device_name(name: str) -> DeviceRef | None:
    """The GPU (and MIG profile id and placement start) a device name stands for; None for a
    name this driver never publishes."""
    if m := GPU_NAME.fullmatch(name):
        return DeviceRef(int(m.group(1)), shared=bool(m.group(2)))
    if m := MIG_NAME.fullmatch(name):
        return DeviceRef(int(m.group(1)), int(m.group(2)), int(m.group(3)), bool(m.group(4)))
    return None


def _version(text: str) -> str:
    """A dotted version as a semantic version ('580.159.04' -> '580.159.4', '13.0' -> '13.0.0')."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def _profile_capacity(p: GiProfile) -> dict[str, int]:
    e = p.engines
    values = (p.memory_bytes, p.multiprocessor_count, e.copy, e.decoder, e.encoder, e.jpeg, e.ofa)
    return {name: v for (name, _), v in zip(CAPACITIES, values, strict=True)}


def _max_capacity(gpu: Gpu) -> dict[str, int]:
    """What the whole GPU offers a partition: each capacity's largest value over the profiles
    (the 7g profile's, in practice)."""
    out = dict.fromkeys((name for name, _ in CAPACITIES), 0)
    for p in gpu.profiles:
        for name, v in _profile_capacity(p).items():
            out[name] = max(out[name], v)
    return out


def _counters(capacity: dict[str, int], slots: Iterable[int]) -> dict[str, dict[str, str]]:
    counter_names = dict(CAPACITIES)
    out = {counter_names[name]: {"value": str(v)} for name, v in capacity.items()}
    out.update({f"memory-slice-{i}": {"value": "1"} for i in slots})
    return out


def _capacity(values: dict[str, int]) -> dict[str, dict[str, str]]:
    return {name: {"value": str(v)} for name, v in values.items()}


def partitionable(gpu: Gpu) -> bool:
    """Whether the GPU's MIG placements are devices. Ampere changes MIG mode only with a GPU
    reset: there, the mode it is in decides (MIG on: slices only; off: the whole GPU only)."""
    return gpu.mig_capable and bool(gpu.profiles)


def offers_whole(gpu: Gpu) -> bool:
    return not (partitionable(gpu) and gpu.architecture == "ampere" and gpu.mig_current)


def offers_slices(gpu: Gpu) -> bool:
    return partitionable(gpu) and (gpu.architecture != "ampere" or gpu.mig_current)


def _gpu_attributes(inventory: Inventory, gpu: Gpu) -> dict[str, dict[str, Any]]:
    major, minor = gpu.compute_capability
    return {
        "type": {"string": "gpu"},
        "index": {"int": gpu.index},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.name},
        "architecture": {"string": gpu.architecture},
        "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
        "driverVersion": {"version": _version(inventory.driver_version)},
        "cudaDriverVersion": {"version": _version(inventory.cuda_version)},
        "pciBusID": {"string": gpu.pci_bus_id},
    }


def gpu_device(inventory: Inventory, gpu: Gpu) -> dict[str, Any]:
    attributes = _gpu_attributes(inventory, gpu)
    device: dict[str, Any] = {"name": gpu_device_name(gpu.index), "attributes": attributes}
    if not offers_slices(gpu):
        device["capacity"] = _capacity({"memory": gpu.memory_total_bytes})
        return device
    full = _max_capacity(gpu)
    device["capacity"] = _capacity(full)
    device["consumesCounters"] = [
        {
            "counterSet": counter_set_name(gpu.index),
            "counters": _counters(full, range(gpu.memory_slice_count)),
        }
    ]
    return device


def mig_device(inventory: Inventory, gpu: Gpu, profile: GiProfile, at: Placement) -> dict[str, Any]:
    attributes = _gpu_attributes(inventory, gpu)
    attributes.pop("uuid")
    attributes.update(
        {
            "type": {"string": "mig"},
            "parentUUID": {"string": gpu.uuid},
            "profile": {"string": profile.name},
            "memorySliceStart": {"int": at.start},
            "memorySliceCount": {"int": at.size},
        }
    )
    capacity = _profile_capacity(profile)
    return {
        "name": mig_device_name(gpu.index, profile, at.start),
        "attributes": attributes,
        "capacity": _capacity(capacity),
        "consumesCounters": [
            {"counterSet": counter_set_name(gpu.index), "counters": _counters(capacity, at.slots())}
        ],
    }


def placement_order(profile: GiProfile) -> list[Placement]:
    """The order a profile's placements are published in: from the highest start down. The
    scheduler takes the first free device that fits (a first fit over the published order),
    so claims fill each GPU from its top: a 3g goes to 4 before 0, small slices to the top
    first, and the low half stays whole for the profiles that fit only there (4g at 0) or fit
    beside a 3g at 4 (2g and 1g at 0-3). 3g + 2g + 1g + 1g then fit on one H200 (3g@4, 2g@2,
    1g@1, 1g@0), where lowest-first left the fourth out (3g@0, 2g@4, 1g@6); 7 x 1g fit either
    way. benchmarks/dra_packing.py compares the orders over mixed arrivals and departures."""
    return sorted(profile.placements, key=lambda at: -at.start)


def made(gpu: Gpu, profile: GiProfile, at: Placement) -> bool:
    """Whether the GPU holds a slice of `profile` at `at` now (a GI without its CI is not one)."""
    return any(
        s.profile_id == profile.id and s.placement.start == at.start and s.mig_uuid is not None
        for s in gpu.slices
    )


def gpu_devices(
    inventory: Inventory, gpu: Gpu, binding: dict[str, list[str]] | None = None
) -> list[dict[str, Any]]:
    """The whole GPU first, then each profile's placements, smallest profile first (memory
    slices, memory, plain before `+me`): a request that several profiles match (a selector
    for "a 1g") takes the smallest that fits, 1g.18gb before 1g.35gb. Each profile's
    placements in placement_order; with `binding` (binding_conditions), each placement not
    made yet carries it."""
    devices = [gpu_device(inventory, gpu)] if offers_whole(gpu) else []
    if offers_slices(gpu):
        smallest = sorted(
            gpu.profiles,
            key=lambda p: (p.placements[0].size if p.placements else 0, p.memory_bytes,
                           "+" in p.name, p.slice_count, p.id),
        )  # fmt: skip
        for profile in smallest:
            for at in placement_order(profile):
                device = mig_device(inventory, gpu, profile, at)
                if binding and not made(gpu, profile, at):
                    device.update({k: list(v) for k, v in binding.items()})
                devices.append(device)
    return devices


def counter_set(gpu: Gpu) -> dict[str, Any]:
    """The GPU's counters: its partitions' (memory slices, memory, SMs, engines), or, for a GPU
    that offers no slices, its memory only (what keeps it and its share device apart)."""
    if not offers_slices(gpu):
        return {"name": counter_set_name(gpu.index), "counters": _counters_whole(gpu)}
    return {
        "name": counter_set_name(gpu.index),
        "counters": _counters(_max_capacity(gpu), range(gpu.memory_slice_count)),
    }


def _counters_whole(gpu: Gpu) -> dict[str, dict[str, str]]:
    return {"memory": {"value": str(gpu.memory_total_bytes)}}


# -- MPS shares (KEP-5075 consumable capacity) -------------------------------------------------


def shares_whole(gpu: Gpu, shares: str) -> bool:
    return shares != "none" and offers_whole(gpu)


def shares_slices(gpu: Gpu, shares: str) -> bool:
    return shares == "mig" and offers_slices(gpu)


def with_shares(
    inventory: Inventory, gpu: Gpu, devices: list[dict[str, Any]], driver: str, shares: str
) -> list[dict[str, Any]]:
    """`devices` (gpu_devices) with the share devices `shares` asks for, each after its twin.
    A GPU that offers no slices consumes its counter set (counter_set) so that it and its
    share device exclude each other."""
    out: list[dict[str, Any]] = []
    for d in devices:
        ref = parse_device_name(d["name"])
        assert ref is not None
        if not ref.is_mig and shares_whole(gpu, shares):
            if not d.get("consumesCounters"):
                counters = {"counterSet": counter_set_name(gpu.index)}
                d = {**d, "consumesCounters": [{**counters, "counters": _counters_whole(gpu)}]}
            out += [d, share_device(d, driver, gpu.memory_total_bytes)]
        elif ref.is_mig and shares_slices(gpu, shares):
            profile = gpu.profile_by_id(ref.profile_id or 0)
            assert profile is not None
            out += [d, share_device(d, driver, profile.memory_bytes)]
        else:
            out.append(d)
    return out


def resource_slices(
    inventory: Inventory,
    node: str,
    driver: str,
    gpus: Collection[int] | None = None,
    shares: str = "none",
    binding: bool = False,
) -> list[SliceSpec]:
    """Every ResourceSlice of this node's pool (named after the node): the counter sets, then
    one slice of devices per GPU. `gpus` limits them to those GPU indices (None: all);
    `shares` (SHARES) says which devices get an MPS share device beside them; `binding`: the
    MIG placements not made yet carry binding conditions (their share devices never do)."""
    conditions = binding_conditions(driver) if binding else None
    chosen = [g for g in inventory.gpus if gpus is None or g.index in gpus]
    prefix = f"{node}-{dns_label(driver)}"
    base = {"driver": driver, "nodeName": node}
    out: list[SliceSpec] = []
    with_counters = [g for g in chosen if offers_slices(g) or shares_whole(g, shares)]
    for k in range(0, len(with_counters), MAX_COUNTER_SETS_PER_SLICE):
        batch = with_counters[k : k + MAX_COUNTER_SETS_PER_SLICE]
        spec = {**base, "sharedCounters": [counter_set(g) for g in batch]}
        out.append(SliceSpec(f"{prefix}-counters-{k // MAX_COUNTER_SETS_PER_SLICE}", spec))
    for gpu in chosen:
        devices = with_shares(
            inventory, gpu, gpu_devices(inventory, gpu, conditions), driver, shares
        )
        for k in range(0, len(devices), MAX_DEVICES_PER_SLICE):
            part = "" if k == 0 else f"-{k // MAX_DEVICES_PER_SLICE}"
            spec = {**base, "devices": devices[k : k + MAX_DEVICES_PER_SLICE]}
            out.append(SliceSpec(f"{prefix}-gpu-{gpu.index}{part}", spec))
    return out
