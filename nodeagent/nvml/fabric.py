"""The GPU's NVLink fabric (GB200 NVL72-style multi-node NVLink): cluster UUID and clique."""

from __future__ import annotations

import ctypes
import uuid
from typing import Any

from nodeagent.nvml.inventory import Fabric
from nodeagent.nvml.session import NOT_SUPPORTED, NvmlSession

_FUNCTION_NOT_FOUND = 13  # a driver older than the call (R550)
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
    info = lib.c_nvmlGpuFabricInfo_t()
    answer = session.call(
        "nvmlDeviceGetGpuFabricInfo",
        dev,
        ctypes.byref(info),  # pynvml hands it to the C function as it is: a pointer
        absent=(NOT_SUPPORTED, _FUNCTION_NOT_FOUND),
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


def cluster_uuid_bytes(info: Any) -> bytes:
    """The 16 bytes of clusterUuid as the driver wrote them: read from the structure's memory,
    since pynvml versions declare the field as c_uint8 or as c_char (whose value stops at the
    first zero byte: an all-zero UUID read as b'', found on the H200)."""
    field = type(info).clusterUuid
    return ctypes.string_at(ctypes.addressof(info) + field.offset, field.size)
