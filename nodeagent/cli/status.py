"""`nodeagent status` and the emulator commands (`nodeagent sim ...`)."""

from __future__ import annotations

import sys

from nodeagent.cli.common import (
    MIB,
    Context,
    print_json,
)
from nodeagent.errors import ConfigError
from nodeagent.nvml import Inventory, read_inventory
from nodeagent.render import render_inventory


def current_sharing(inventory: Inventory) -> dict[int, str]:
    """How each GPU is shared, as far as the GPU and the default MPS root show it: MIG, under
    an MPS daemon (flat or device-plugin layout under /run/nvidia/mps), else whole
    (time-slicing leaves no trace on a GPU). Reads files only: no settings, no commands."""
    from nodeagent.mps.control import MpsControl
    from nodeagent.settings import DEFAULT_MPS_ROOT

    served: set[str] = set()
    pipes = [DEFAULT_MPS_ROOT / "pipe", *DEFAULT_MPS_ROOT.glob("*/*/pipe")]
    for pipe in pipes:
        served.update(
            MpsControl("nvidia-cuda-mps-control", pipe, pipe.parent / "log").served_devices()
        )
    return {
        g.index: "mig" if g.mig_current else "mps" if g.uuid in served else "whole"
        for g in inventory.gpus
    }


def cmd_status(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    sharing = current_sharing(inventory)
    if ctx.args.output == "json":
        print_json({**inventory.to_dict(), "sharing": {str(i): s for i, s in sharing.items()}})
    else:
        sys.stdout.write(render_inventory(inventory, sharing))
    return 0


def _check_pid(pid: int) -> None:
    """Before the emulator opens (and creates its state file): bad input changes nothing."""
    from nodeagent.sim.rules import MAX_PID

    if not 1 <= pid <= MAX_PID:
        raise ConfigError(f"--pid must be a process id from 1 to {MAX_PID}, not {pid}")


def cmd_sim_attach(ctx: Context) -> int:
    _check_pid(ctx.args.pid)
    if ctx.args.memory_mib < 0:
        raise ConfigError(f"--memory-mib must be 0 or more, not {ctx.args.memory_mib}")
    if not 0.0 <= ctx.args.load <= 1.0:
        raise ConfigError(f"--load must be between 0 and 1, not {ctx.args.load}")
    where = ctx.emulator("attach").attach(
        ctx.args.device, ctx.args.pid, ctx.args.memory_mib * MIB, ctx.args.load
    )
    print(f"pid {ctx.args.pid} attached to {where} with {ctx.args.memory_mib} MiB")
    return 0


def cmd_sim_detach(ctx: Context) -> int:
    """Exit 1 (nothing matched) when no emulated process has that pid."""
    _check_pid(ctx.args.pid)
    ctx.emulator("detach").detach(ctx.args.pid)
    print(f"pid {ctx.args.pid} detached")
    return 0


def cmd_sim_reset(ctx: Context) -> int:
    """Exit 3 (the GPU refused) when processes run on the GPU, as `nvidia-smi -r` would."""
    ctx.emulator("reset").reset(ctx.args.gpu)
    print(f"GPU {ctx.args.gpu} reset")
    return 0
