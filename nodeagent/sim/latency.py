"""How long the emulator's NVML writes take (`SimBase.latency`, seconds by NVML function):
none by default (the tests run at the emulator's own speed); benchmarks set it, and
NODEAGENT_SIM_LATENCY (`h200`, or `op=seconds,...`) sets it for any emulator, e.g.
`nodeagent run --simulate h200x4`. The emulated call sleeps inside itself, under the
emulator's lock (which the NVML session holds as its own): the caller blocks for the whole
call and no other NVML call runs meanwhile, as with the real driver.

The `h200` profile, and where each figure comes from (stored public material):

- set-mig-mode 4 s, measured: mig-parted's debug log in NVIDIA/gpu-operator issue #351 (a DGX
  A100-80GB, device id 0x20B210DE, 2022-05-11) shows "Updating MIG mode: Enabled" followed by
  "Mode change pending: false" 4-5 s later on each GPU in turn (1 s log resolution); the same
  tool's log in NVIDIA/gpu-operator issue #1606 (A100 0x20B010DE) shows 2 s from "Applying MIG
  mode change..." to the next step. Hopper changes the mode without a GPU reset; the A100
  figure is kept as the bound.
- create-gi 0.25 s, create-ci 0.10 s, destroy-ci 0.05 s, destroy-gi 0.10 s: ASSUMED. No
  published per-call timing of these was found; NVIDIA's DRA driver logs exactly these spans
  (`t_prep_create_mig_dev_cigi`, `t_delete_mig_device`:
  kubernetes-sigs/dra-driver-nvidia-gpu@95932046 cmd/gpu-kubelet-plugin/nvlib.go) but no run's
  values are public, and MIG is never written on the lent H200.
"""

from __future__ import annotations

import os

from nodeagent.base.errors import SimError

LATENCY_ENV = "NODEAGENT_SIM_LATENCY"

OP_FUNCTIONS = {
    "create-gi": ("nvmlDeviceCreateGpuInstance", "nvmlDeviceCreateGpuInstanceWithPlacement"),
    "create-ci": (
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    ),
    "destroy-ci": ("nvmlComputeInstanceDestroy",),
    "destroy-gi": ("nvmlGpuInstanceDestroy",),
    "set-mig-mode": ("nvmlDeviceSetMigMode",),
}

PROFILES: dict[str, dict[str, float]] = {
    "off": {},
    # see the module's text for the source of each figure
    "h200": {
        "create-gi": 0.25,
        "create-ci": 0.10,
        "destroy-ci": 0.05,
        "destroy-gi": 0.10,
        "set-mig-mode": 4.0,
    },
}


def by_function(seconds_by_op: dict[str, float]) -> dict[str, float]:
    """The emulator's table (seconds by NVML function) for seconds by operation."""
    return {fn: s for op, s in seconds_by_op.items() for fn in OP_FUNCTIONS[op] if s}


def parse_latency(text: str) -> dict[str, float]:
    """`h200`, `off`, or `op=seconds,...` (ops: create-gi, create-ci, destroy-ci, destroy-gi,
    set-mig-mode; the others take no time) -> seconds by NVML function. Raises SimError
    naming the part that is wrong."""
    text = text.strip()
    if text in PROFILES:
        return by_function(PROFILES[text])
    ops: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op, sep, number = (x.strip() for x in part.partition("="))
        try:
            seconds = float(number) if sep else -1.0
        except ValueError:
            seconds = -1.0
        if op not in OP_FUNCTIONS or not 0 <= seconds < 3600:
            raise SimError(
                f"{LATENCY_ENV}: '{part}' is not OP=SECONDS with OP one of "
                f"{', '.join(OP_FUNCTIONS)} and SECONDS from 0 to 3600 "
                f"(or a profile: {', '.join(PROFILES)})"
            )
        ops[op] = seconds
    return by_function(ops)


def latency_from_env() -> dict[str, float]:
    """NODEAGENT_SIM_LATENCY's table (empty when unset). Raises SimError."""
    return parse_latency(os.environ.get(LATENCY_ENV, ""))
