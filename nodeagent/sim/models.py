"""Device models for the emulator, loaded from package data read off real GPUs.

`h200` is `models/h200-sxm-141gb.json` unchanged (NVML read from a real H200). The A100-40GB,
A100-80GB, H100-80GB and A30 tables come from `models/mig-user-guide-models.json` (NVIDIA's MIG
user guide cross-checked with `nvidia-smi mig -lgip/-lgipp` captures). Every other GPU that the GPU
operator's default MIG ConfigMap names (B200, GB200, B300, GB300, RTX PRO 6000, H100 NVL/PCIe,
GH200, H20, H800, A800, ...) is in `models/operator-models.json`, same shape, each value with its
source or marked derived/unsourced there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from nodeagent.base.errors import SimError

MIB = 1024 * 1024

# NVML_GPU_INSTANCE_PROFILE_* constant values (pynvml); kept here so that models load without NVML.
_PROFILE_CONSTANTS = {
    "1_SLICE": 0,
    "2_SLICE": 1,
    "3_SLICE": 2,
    "4_SLICE": 3,
    "7_SLICE": 4,
    "8_SLICE": 5,
    "6_SLICE": 6,
    "1_SLICE_REV1": 7,
    "2_SLICE_REV1": 8,
    "1_SLICE_REV2": 9,
    "1_SLICE_GFX": 10,
    "2_SLICE_GFX": 11,
    "4_SLICE_GFX": 12,
    "1_SLICE_NO_ME": 13,
    "2_SLICE_NO_ME": 14,
    "1_SLICE_ALL_ME": 15,
    "2_SLICE_ALL_ME": 16,
    "3_SLICE_GFX": 17,
}
PROFILE_CONSTANT_COUNT = 18
# Profile-name attributes -> the suffix of their NVML_GPU_INSTANCE_PROFILE_<N>_SLICE_* constant.
_ATTRIBUTE_CONSTANTS = {"": "", "+me": "REV1", "+gfx": "GFX", "+me.all": "ALL_ME", "-me": "NO_ME"}
# The real H200 answered INVALID_ARGUMENT (not NOT_SUPPORTED) for this constant.
INVALID_ARGUMENT_CONSTANTS = frozenset({_PROFILE_CONSTANTS["3_SLICE_GFX"]})


@dataclass(frozen=True)
class ProfileModel:
    """One GPU-instance profile as NVML's nvmlGpuInstanceProfileInfo_v2_t reports it."""

    constant: int
    id: int
    name: str  # as NVML returns it, with the "MIG " prefix
    slice_count: int
    instance_count: int
    multiprocessor_count: int
    copy_engine_count: int
    decoder_count: int
    encoder_count: int
    jpeg_count: int
    ofa_count: int
    memory_size_mb: int
    is_p2p_supported: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class DeviceModel:
    """One GPU model: device facts and its GPU-instance profile table."""

    key: str
    name: str
    pci_device_id: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_total_bytes: int
    memory_reserved_bytes: int
    memory_slices: int
    compute_slices: int
    driver_version: str
    cuda_driver_version: int
    gpm_supported: bool
    profiles: tuple[ProfileModel, ...]
    # NVLink fabric as nvmlDeviceGetGpuFabricInfo reports it: (state, status, cluster UUID,
    # clique id); None: NOT_SUPPORTED (the model's JSON has no "fabric").
    fabric: tuple[int, int, str, int] | None = None

    def profile_by_id(self, profile_id: int) -> ProfileModel | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def profile_by_constant(self, constant: int) -> ProfileModel | None:
        return next((p for p in self.profiles if p.constant == constant), None)


def _read_package_json(name: str) -> dict[str, Any]:
    text = resources.files("nodeagent.sim").joinpath("models").joinpath(name).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _profile(raw: dict[str, Any], constant: int) -> ProfileModel:
    name = raw["name"] if raw["name"].startswith("MIG ") else f"MIG {raw['name']}"
    return ProfileModel(
        constant=constant,
        id=int(raw["id"]),
        name=name,
        slice_count=int(raw["sliceCount"]),
        instance_count=int(raw["instanceCount"]),
        multiprocessor_count=int(raw["multiprocessorCount"]),
        copy_engine_count=int(raw["copyEngineCount"]),
        decoder_count=int(raw["decoderCount"]),
        encoder_count=int(raw["encoderCount"]),
        jpeg_count=int(raw["jpegCount"]),
        ofa_count=int(raw["ofaCount"]),
        memory_size_mb=int(raw["memorySizeMB"]),
        is_p2p_supported=int(raw.get("isP2pSupported", 0)),
        placements=tuple((int(s), int(n)) for s, n in raw["placements"]),
    )


def infer_constant(raw: dict[str, Any]) -> int:
    """The NVML_GPU_INSTANCE_PROFILE_* constant that selects a profile, from its shape.

    The user-guide models do not record it. The rule (Ng → N_SLICE, `+me` → the REV1 variant,
    a 1g profile with two memory slices → 1_SLICE_REV2) reproduces every constant read off the
    real H200, which a test checks. The RTX PRO 6000 attributes follow the constants' names:
    `+gfx` → N_SLICE_GFX, `+me.all` → N_SLICE_ALL_ME, `-me` → N_SLICE_NO_ME.
    """
    if "constant" in raw:
        return _PROFILE_CONSTANTS[str(raw["constant"]).removeprefix("NVML_GPU_INSTANCE_PROFILE_")]
    match = re.match(r"(?:MIG )?(\d+)g\.\d+gb(.*)$", raw["name"])
    if not match:
        raise SimError(f"device model profile {raw['name']!r} has no '<N>g.<M>gb' name")
    slices, attributes = int(match.group(1)), match.group(2)
    suffix = _ATTRIBUTE_CONSTANTS.get(attributes)
    if attributes and suffix is None:
        raise SimError(f"device model profile {raw['name']!r} has unknown attributes")
    if suffix:
        key = f"{slices}_SLICE_{suffix}"
        if key not in _PROFILE_CONSTANTS:
            raise SimError(f"device model profile {raw['name']!r}: NVML has no constant {key}")
        return _PROFILE_CONSTANTS[key]
    if slices == 1 and raw["placements"] and raw["placements"][0][1] == 2:
        return _PROFILE_CONSTANTS["1_SLICE_REV2"]
    return _PROFILE_CONSTANTS[f"{slices}_SLICE"]


def _h200() -> DeviceModel:
    raw = _read_package_json("h200-sxm-141gb.json")
    dev = raw["device"]
    profiles = tuple(
        _profile(p, _PROFILE_CONSTANTS[p["constant"].removeprefix("NVML_GPU_INSTANCE_PROFILE_")])
        for p in raw["gpu_instance_profiles"]
    )
    return DeviceModel(
        key="h200",
        name=dev["name"],
        pci_device_id=int(dev["pci_device_id"], 16),
        architecture=int(dev["architecture"]),
        compute_capability=(dev["cuda_compute_capability"][0], dev["cuda_compute_capability"][1]),
        memory_total_bytes=int(dev["memory_total_bytes"]),
        memory_reserved_bytes=int(dev["memory_reserved_bytes"]),
        memory_slices=8,
        compute_slices=7,
        driver_version=raw["driver_version"],
        cuda_driver_version=int(raw["cuda_driver_version"]),
        gpm_supported=bool(dev["gpm_supported"]),
        profiles=profiles,
    )


_USER_GUIDE_FILE = "mig-user-guide-models.json"
_OPERATOR_FILE = "operator-models.json"


def _raw_model(file: str, raw_key: str) -> dict[str, Any]:
    raw: dict[str, Any] = _read_package_json(file)["models"][raw_key]
    return raw


def _profile_table(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """A model's GI profiles, following `gpu_instance_profiles_same_as` to another model."""
    same = raw.get("gpu_instance_profiles_same_as")
    if same is None:
        table: list[dict[str, Any]] = raw["gpu_instance_profiles"]
        return table
    file = _OPERATOR_FILE if same in _OPERATOR_KEYS else _USER_GUIDE_FILE
    return _profile_table(_raw_model(file, _USER_GUIDE_KEYS.get(same, same)))


def _from_table(key: str, file: str, raw_key: str) -> DeviceModel:
    raw = _raw_model(file, raw_key)
    profiles = tuple(_profile(p, infer_constant(p)) for p in _profile_table(raw))
    slots = max(s + n for p in profiles for s, n in p.placements)
    return DeviceModel(
        key=key,
        name=raw["name"],
        pci_device_id=int(raw["pci_device_id"], 16),
        architecture=int(raw["nvml_architecture"]),
        compute_capability=(raw["cuda_compute_capability"][0], raw["cuda_compute_capability"][1]),
        memory_total_bytes=int(raw["memory_total_mib"]) * MIB,
        # Not in the user-guide captures; the driver's reservation is a few hundred MiB on every
        # model (the operator models record it where an nvidia-smi -q capture shows it).
        memory_reserved_bytes=int(raw.get("memory_reserved_mib", 512)) * MIB,
        memory_slices=int(raw.get("memory_slices", slots)),
        compute_slices=max(p.slice_count for p in profiles),
        driver_version="580.159.04",
        cuda_driver_version=13000,
        gpm_supported=int(raw["nvml_architecture"]) >= 9,
        profiles=profiles,
        fabric=_fabric(raw.get("fabric")),
    )


def _fabric(raw: dict[str, Any] | None) -> tuple[int, int, str, int] | None:
    if raw is None:
        return None
    return (int(raw["state"]), int(raw["status"]), str(raw["clusterUuid"]), int(raw["cliqueId"]))


_USER_GUIDE_KEYS = {
    "a100-40gb": "a100-40gb",
    "a100-80gb": "a100-80gb",
    "h100-80gb": "h100-80gb",
    "a30": "a30-24gb",
}
# The GPU operator's ConfigMap models; the --simulate name is the key in operator-models.json.
_OPERATOR_KEYS = (
    "b200",
    "gb200",
    "b300",
    "gb300",
    "rtx-pro-6000",
    "h100-nvl",
    "h100-pcie",
    "h100-96gb",
    "h800",
    "h800-pcie",
    "h800-nvl",
    "gh200-96gb",
    "gh200-144gb",
    "h20",
    "a100-pcie-40gb",
    "a100-pcie-80gb",
    "a800-40gb",
    "a800-80gb",
    "a800-80gb-pcie",
)
MODEL_NAMES = ("h200", *_USER_GUIDE_KEYS, *_OPERATOR_KEYS)


@cache
def load_model(key: str) -> DeviceModel:
    """Return the device model named `key` (`h200`, `a100-40gb`, ...); raises SimError."""
    if key == "h200":
        return _h200()
    if key in _USER_GUIDE_KEYS:
        return _from_table(key, _USER_GUIDE_FILE, _USER_GUIDE_KEYS[key])
    if key in _OPERATOR_KEYS:
        return _from_table(key, _OPERATOR_FILE, key)
    raise SimError(f"unknown GPU model {key!r}; known models: {', '.join(MODEL_NAMES)}")


MAX_GPUS = 255  # one PCI bus of domain 0 each (state.py numbers them)
# Spec suffix: GPUs whose platform exposes no GPU reset (a pass-through VM), so that an Ampere
# MIG mode change stays pending until `nodeagent sim reboot` (a100-40gbx2:no-reset).
NO_RESET = ":no-reset"


def parse_spec(spec: str) -> list[str]:
    """Turn a simulate SPEC (`h200`, `h200x8`, `a100-40gbx2,h100-80gb`) into model keys; a
    part ending in `:no-reset` keeps that suffix (its GPUs refuse a reset: state.py).

    Raises SimError naming the bad part: an empty one, an unknown model, a count that is not
    1 to MAX_GPUS, or more than MAX_GPUS GPUs in all.
    """
    keys: list[str] = []
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise SimError(f"simulate spec {spec!r} is empty or has an empty part; try 'h200x2'")
    for part in parts:
        match = re.fullmatch(r"(.+?)(?:x(-?[0-9]+))?(:no-reset)?", part.lower())
        if not match or match.group(1) not in MODEL_NAMES:
            raise SimError(
                f"simulate spec part {part!r} names no known GPU model; "
                f"known models: {', '.join(MODEL_NAMES)} (optionally xN, e.g. h200x8, and"
                f" {NO_RESET} for GPUs whose reset is refused)"
            )
        count = int(match.group(2)) if match.group(2) else 1
        if not 1 <= count <= MAX_GPUS:
            raise SimError(f"simulate spec part {part!r}: count must be 1..{MAX_GPUS} GPUs")
        keys.extend([match.group(1) + (match.group(3) or "")] * count)
    if len(keys) > MAX_GPUS:
        raise SimError(f"simulate spec {spec!r} asks for {len(keys)} GPUs; at most {MAX_GPUS}")
    return keys
