"""What the fake kubelet learns from a device plugin, as plain frozen dataclasses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PluginOptions:
    pre_start_required: bool
    get_preferred_allocation_available: bool


@dataclass(frozen=True)
class Registration:
    version: str
    endpoint: str
    resource_name: str
    options: PluginOptions


@dataclass(frozen=True)
class Device:
    id: str
    health: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceSpec:
    host_path: str
    container_path: str
    permissions: str


@dataclass(frozen=True)
class Allocation:
    device_ids: tuple[str, ...]
    envs: dict[str, str]
    mounts: tuple[Mount, ...]
    devices: tuple[DeviceSpec, ...]
    annotations: dict[str, str]
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True)
class Session:
    """What the kubelet learnt from one plugin: registration, options, devices, one allocation."""

    registration: Registration
    options: PluginOptions  # GetDevicePluginOptions, asked while registering
    devices: tuple[Device, ...]  # the first ListAndWatch answer
    preferred_device_ids: tuple[str, ...] | None  # None: the plugin offers no preference
    allocation: Allocation | None  # None: nothing asked for (allocate 0)
    pre_start_called: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
