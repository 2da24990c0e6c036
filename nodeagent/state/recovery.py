"""What recovers a GPU after an XID: nothing (the fault clears after dra.health-hold), a GPU
reset, or a node reboot. Pure.

The driver says it itself where it can: NVML's field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230;
drivers from R565 on, NVML's change log) reads one nvmlDeviceGpuRecoveryAction_t per GPU, and
the driver announces each change with Xid 154. Where the driver does not report it,
the XID's code decides, by NVIDIA's Xid catalog (the data file xid_recovery.tsv beside this
module names its source).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

HOLD, RESET, REBOOT = "hold", "reset", "reboot"  # what a fault waits for before it clears

# nvmlDeviceGpuRecoveryAction_t (nvml.h; NVIDIA's "Error Recovery and Response Flags" says
# what each asks of the operator), by the name a fault kind carries, and what it waits for:
# every action but NONE holds its fault until the driver reads NONE again.
NONE = 0
ACTIONS: dict[int, tuple[str, str]] = {
    1: ("gpu-reset", RESET),  # NVML_GPU_RECOVERY_ACTION_GPU_RESET: nvidia-smi -r
    2: ("node-reboot", REBOOT),  # NODE_REBOOT: the OS may be inconsistent
    3: ("drain-p2p", RESET),  # DRAIN_P2P: stop the peer-to-peer (NVLink) traffic
    4: ("drain-and-reset", RESET),  # DRAIN_AND_RESET (R570+): drain P2P, then reset
    5: ("recover-imex-domain", RESET),  # RECOVER_IMEX_DOMAIN (R575+)
    6: ("bus-reset", RESET),  # BUS_RESET: reset the GPU's PCIe bus
    7: ("system-reboot", REBOOT),  # SYSTEM_REBOOT
}
ACTION_NAMES = ("none", *(name for name, _ in ACTIONS.values()))
RECOVERY_PREFIX = "recovery-"

# The catalog's "Resolution Bucket (Immediate Action)" -> what the fault waits for; any other
# bucket (restart the application, ignore, contact support, ...) clears after the hold.
BUCKETS = {
    "RESET_GPU": RESET,
    "WORKFLOW_XID_48": RESET,  # double-bit ECC: reset the GPU (it retires the row or page)
    "WORKFLOW_NVLINK_ERR": RESET,
    "WORKFLOW_NVLINK5_ERR": RESET,
    "RESTART_BM": REBOOT,  # restart the bare-metal node
    "RESTART_VM": REBOOT,  # restart the VM: the node, where nodeagent runs in it
}


def action_kind(action: int) -> str:
    """The fault kind of a recovery action other than NONE: recovery-gpu-reset, or
    recovery-<number> for one this nodeagent does not know."""
    return RECOVERY_PREFIX + ACTIONS.get(action, (str(action), RESET))[0]


def action_value(name: str) -> int | None:
    """The NVML value of an action's name ("none", "gpu-reset", ...), None for another name."""
    if name == "none":
        return NONE
    return next((value for value, (n, _) in ACTIONS.items() if n == name), None)


@cache
def xid_buckets() -> dict[int, str]:
    """XID code -> the catalog's immediate-action bucket, as the shipped table lists them."""
    text = resources.files("nodeagent.state").joinpath("xid_recovery.tsv").read_text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            code, bucket, _ = line.split("\t")
            out[int(code)] = bucket
    return out


def xid_waits_for(code: int) -> str:
    """What a fault of XID `code` waits for by the catalog (HOLD for a code it does not list),
    where the driver reports no recovery action."""
    return BUCKETS.get(xid_buckets().get(code, ""), HOLD)


def xids_waiting_for(what: str) -> tuple[int, ...]:
    """Every XID code of the table that waits for `what` (RESET or REBOOT), in order."""
    return tuple(code for code in sorted(xid_buckets()) if xid_waits_for(code) == what)
