"""`nodeagent status` and the emulator commands (`nodeagent sim ...`)."""

from __future__ import annotations

import sys

from nodeagent.cli.common import (
    MIB,
    Context,
    print_json,
)
from nodeagent.errors import ConfigError
from nodeagent.nvml import read_inventory
from nodeagent.render import render_inventory


def cmd_status(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    if ctx.args.output == "json":
        print_json(inventory.to_dict())
    else:
        sys.stdout.write(render_inventory(inventory))
    return 0


def cmd_sim_attach(ctx: Context) -> int:
    if ctx.args.pid <= 0:
        raise ConfigError(f"--pid must be a positive process id, not {ctx.args.pid}")
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
    ctx.emulator("detach").detach(ctx.args.pid)
    print(f"pid {ctx.args.pid} detached")
    return 0


def cmd_sim_reset(ctx: Context) -> int:
    ctx.emulator("reset").reset(ctx.args.gpu)
    print(f"GPU {ctx.args.gpu} reset")
    return 0
