"""The GPU's NVLink fabric (GB200 NVL72-style multi-node NVLink): cluster UUID and clique."""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

from nodeagent.nvml.codes import FUNCTION_NOT_FOUND, NOT_SUPPORTED
from nodeagent.nvml.inventory import Fabric
from nodeagent.nvml.session import NvmlSession

STATE_NOT_SUPPORTED = 0
STATE_COMPLETED = 3


def read_fabric(session: NvmlSession, dev: Any, uuid_key: str) -> Fabric | None:
    """The GPU's fabric info, or None where NVML reports none (NOT_SUPPORTED, a driver without
    the call, or state NOT_SUPPORTED). A completed registration cannot change while NVML is
    loaded, nor can "not supported": those are read once per GPU UUID and session; a GPU
    still registering (not started, in progress) is read again at the next inventory read,
    one NVML call, until it settles. The caller holds the session's lock.

    GFD reads it through nvmlDeviceGetGpuFabricInfo (go-nvlib prefers it to the versioned
    call); so does this. nvidia-smi equivalent: `nvidia-smi -q`, section Fabric.
    """
    kept: dict[str, Fabric | None] = session.static.setdefault("gpu-fabric", {})
    if uuid_key in kept:
        return kept[uuid_key]
    lib = session.lib
    if not hasattr(lib, "nvmlDeviceGetGpuFabricInfo"):
        kept[uuid_key] = None
        return None
    info = GpuFabricInfo()
    answer = session.call(
        "nvmlDeviceGetGpuFabricInfo",
        dev,
        ctypes.byref(info),  # pynvml hands it to the C function as it is: a pointer
        absent=(NOT_SUPPORTED, FUNCTION_NOT_FOUND),
    )
    if answer is None or int(info.state) == STATE_NOT_SUPPORTED:
        kept[uuid_key] = None
        return None
    fabric = Fabric(
        state=int(info.state),
        status=int(info.status),
        cluster_uuid=str(uuid.UUID(bytes=cluster_uuid_bytes(info))),
        clique_id=int(info.cliqueId),
    )
    if fabric.state == STATE_COMPLETED:
        kept[uuid_key] = fabric
    return fabric


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h declares it (go-nvml's copy in k8s-device-plugin 1b826ac:
    a 16-byte UUID, status, clique, and an unsigned char state). Not pynvml's
    c_nvmlGpuFabricInfo_t: the lent H200's pynvml declares the UUID 80 bytes long, which moves
    every field after it (state read as 0, a UUID of 80 bytes)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint8),
    ]


def cluster_uuid_bytes(info: GpuFabricInfo) -> bytes:
    """The 16 bytes of the cluster UUID."""
    return bytes(info.clusterUuid)
