"""`nodeagent status` and the emulator commands (`nodeagent sim ...`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from nodeagent.base.errors import ConfigError
from nodeagent.cli.common import (
    MIB,
    Context,
    print_json,
)

if TYPE_CHECKING:
    from nodeagent.nvml import Inventory


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
    from nodeagent.cli.render import render_inventory
    from nodeagent.nvml import read_inventory

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


def cmd_sim_reboot(ctx: Context) -> int:
    """The emulated node reboots: processes end, MIG instances go, a pending mode applies."""
    ctx.emulator("reboot").reboot()
    print("the emulated node rebooted")
    return 0


def add_sim_health_parsers(simsub: Any) -> None:
    p = simsub.add_parser("health", help="set an emulated GPU's health counters")
    p.add_argument("--gpu", "-i", required=True, type=int)
    p.add_argument("--temperature", type=int, help="degrees C (else it follows the load)")
    p.add_argument("--power-watts", type=float, help="power draw (else it follows the load)")
    p.add_argument("--sm-clock-mhz", type=int)
    p.add_argument("--memory-clock-mhz", type=int)
    p.add_argument(
        "--throttle",
        help="clock-event reasons in force, comma-separated (e.g. sw_thermal_slowdown), or none",
    )
    p.add_argument("--ecc-corrected", type=int, help="corrected ECC errors to add")
    p.add_argument("--ecc-uncorrected", type=int, help="uncorrected ECC errors to add")
    p.add_argument("--pcie-replays", type=int, help="PCIe replays to add")
    p.add_argument("--row-remap-pending", type=int, choices=(0, 1))
    p.add_argument("--row-remap-failure", type=int, choices=(0, 1))
    p.add_argument(
        "--recovery-action",
        help="the driver's GPU recovery action: none, gpu-reset, node-reboot, drain-p2p,"
        " drain-and-reset, ...; unsupported: a driver without it (a GPU reset or reboot"
        " brings it back to none)",
    )
    p.add_argument("--clear", action="store_true", help="drop the values set before first")
    p.set_defaults(func=cmd_sim_health)
    p = simsub.add_parser("xid", help="make an emulated GPU report an XID error")
    p.add_argument("--gpu", "-i", required=True, type=int)
    p.add_argument("--xid", required=True, type=int, help="the XID code, e.g. 79")
    p.add_argument("--count", type=int, default=1, help="how many times (1 to 1000)")
    p.add_argument("--gi", type=int, help="of this GPU instance (a MIG slice; default: the GPU)")
    p.add_argument(
        "--recovery-action",
        help="the recovery action the driver sets with it (gpu-reset, node-reboot, ...)",
    )
    p.set_defaults(func=cmd_sim_xid)


def _check_gpu(ctx: Context, index: int) -> None:
    from nodeagent.sim import parse_spec

    count = len(parse_spec(ctx.simulate)) if ctx.simulate else 0
    if ctx.simulate and not 0 <= index < count:
        raise ConfigError(f"GPU {index} does not exist (this node has {count} GPUs)")


def _throttle(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    return [] if names == ["none"] else names


def cmd_sim_health(ctx: Context) -> int:
    """Exit 2 for a bad value or GPU (nothing changes)."""
    a: argparse.Namespace = ctx.args
    values = {
        "temperature_celsius": a.temperature,
        "power_watts": a.power_watts,
        "sm_clock_mhz": a.sm_clock_mhz,
        "memory_clock_mhz": a.memory_clock_mhz,
        "throttle": _throttle(a.throttle),
        "ecc_corrected": a.ecc_corrected,
        "ecc_uncorrected": a.ecc_uncorrected,
        "pcie_replays": a.pcie_replays,
        "row_remap_pending": a.row_remap_pending,
        "row_remap_failure": a.row_remap_failure,
        "recovery_action": a.recovery_action,
        "clear": a.clear,
    }
    if not a.clear and all(v is None for k, v in values.items() if k != "clear"):
        raise ConfigError("'nodeagent sim health' needs at least one value to set (see --help)")
    from nodeagent.sim.healthcalls import check_health

    check_health(values)  # before the emulator opens (and creates its state file)
    _check_gpu(ctx, a.gpu)
    ctx.emulator("health").set_health(a.gpu, **values)
    print(f"GPU {a.gpu} health set")
    return 0


def cmd_sim_xid(ctx: Context) -> int:
    """Exit 2 for a bad XID, count or GPU (nothing changes)."""
    from nodeagent.sim.healthcalls import check_recovery_action, check_xid

    check_xid(ctx.args.xid, ctx.args.count)
    check_recovery_action(ctx.args.recovery_action)
    _check_gpu(ctx, ctx.args.gpu)
    ctx.emulator("xid").inject_xid(
        ctx.args.gpu, ctx.args.xid, ctx.args.count, ctx.args.gi, ctx.args.recovery_action
    )
    of = f" (GPU instance {ctx.args.gi})" if ctx.args.gi is not None else ""
    print(
        f"GPU {ctx.args.gpu}{of} reported XID {ctx.args.xid}"
        + (f" {ctx.args.count} times" if ctx.args.count != 1 else "")
    )
    return 0
