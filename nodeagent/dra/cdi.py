"""One CDI spec per prepared claim: the container edits for each of its devices. Pure (the
file is written by nodeagent.dra.prepare).

As NVIDIA's DRA driver does (cmd/gpu-kubelet-plugin/cdi.go), the spec is transient (named
after the claim UID: `k8s.<driver>-claim_<uid>.json`, CDI's GenerateTransientSpecName), its
kind is `k8s.<driver>/claim`, and each device is `<claim uid>-<device name>`, so the CDI ids
returned to the kubelet are `k8s.<driver>/claim=<uid>-<device>`. The edits select the GPU or
MIG device by UUID (NVIDIA_VISIBLE_DEVICES, which the NVIDIA container toolkit turns into
device nodes and driver mounts, as it does for the device plugin) and, for an MPS share, point
the clients at the MPS daemon serving the claim, with the claim's own limits as client
environment (an MpsConfig's daemon is the claim's own; a share device's is the device's one
server for all its share claims, nodeagent.mps.servers, and NODEAGENT_MPS_CLAIM names the claim):
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is the claim's SM **limit** (a share's smLimit, default 100;
not its request, which is what the scheduler counted), CUDA_MPS_PINNED_DEVICE_MEM_LIMIT its
memory (hard), and for a share CUDA_MPS_CLIENT_PRIORITY its priority (0 normal, 1 low).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nodeagent.mps.claims import ClaimLimits
from nodeagent.state.held import PreparedDevice

CDI_VERSION = "0.6.0"
CLASS = "claim"


def vendor(driver: str) -> str:
    return f"k8s.{driver}"


def kind(driver: str) -> str:
    return f"{vendor(driver)}/{CLASS}"


def spec_file(cdi_dir: Path, driver: str, claim_uid: str) -> Path:
    return cdi_dir / f"{vendor(driver)}-{CLASS}_{claim_uid.replace('/', '_')}.json"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{kind(driver)}={cdi_device_name(claim_uid, device)}"


CLAIM_ENV = "NODEAGENT_MPS_CLAIM"  # a share client's claim UID: the watch attributes it by this


def _edits(device: PreparedDevice, claim_uid: str) -> dict[str, Any]:
    uuid = device.mig_uuid if device.is_mig else device.gpu_uuid
    env = [f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    edits: dict[str, Any] = {"env": env}
    if device.mps:
        pipe = str(device.mps["pipe_dir"])
        limits = ClaimLimits.of(device.mps)
        env.append(f"CUDA_MPS_PIPE_DIRECTORY={pipe}")
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={limits.limit_percent}")
        if limits.memory_bytes:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limits.memory_bytes >> 20}M")
        if device.shared:  # one server for the device's claims: whose client is this
            env.append(f"CUDA_MPS_CLIENT_PRIORITY={limits.client_priority}")
            env.append(f"{CLAIM_ENV}={claim_uid}")
        edits["mounts"] = [
            {"hostPath": pipe, "containerPath": pipe, "options": ["rbind", "rw"]},
        ]
    return edits


def render(driver: str, claim_uid: str, devices: Iterable[PreparedDevice]) -> dict[str, Any]:
    """The claim's CDI spec as data."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": [
            {"name": cdi_device_name(claim_uid, d.device), "containerEdits": _edits(d, claim_uid)}
            for d in devices
        ],
    }


def render_text(driver: str, claim_uid: str, devices: Iterable[PreparedDevice]) -> str:
    return json.dumps(render(driver, claim_uid, devices), indent=1, sort_keys=True) + "\n"
