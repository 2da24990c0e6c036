"""`nodeagent mps start|stop|status` and the MPS flags shared with `run --mps`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from nodeagent.cli.common import (
    Context,
    print_json,
)
from nodeagent.mps.daemon import MpsDaemon, MpsStatus
from nodeagent.mps.settings import (
    DEFAULT_ROOT,
    Limits,
    MpsSettings,
    parse_devices,
    parse_pinned,
    validate,
)
from nodeagent.nvml import read_inventory
from nodeagent.nvml.write import ComputeModeWriter


def add_mps_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    g = p.add_argument_group(
        "MPS (the same settings for `nodeagent mps` and `nodeagent run --mps`)"
    )
    g.add_argument(
        "--mps-devices",
        default=env("NODEAGENT_MPS_DEVICES"),
        help="GPU indices, e.g. 0,1 (default: every GPU without MIG)",
    )
    g.add_argument(
        "--mps-replicas",
        type=int,
        default=int(env("NODEAGENT_MPS_REPLICAS", "2")),
        help="clients sharing each GPU (>= 2; env NODEAGENT_MPS_REPLICAS)",
    )
    g.add_argument(
        "--mps-thread-percentage",
        type=int,
        default=None,
        help="default active thread percentage, 1-100 (default 100 // replicas)",
    )
    g.add_argument(
        "--mps-pinned-memory",
        default=env("NODEAGENT_MPS_PINNED_MEMORY"),
        help="per-GPU pinned memory limit: SIZE or INDEX=SIZE,... (default memory / replicas)",
    )
    g.add_argument(
        "--mps-pipe-dir", default=env("CUDA_MPS_PIPE_DIRECTORY", str(DEFAULT_ROOT / "pipe"))
    )
    g.add_argument(
        "--mps-log-dir", default=env("CUDA_MPS_LOG_DIRECTORY", str(DEFAULT_ROOT / "log"))
    )
    g.add_argument("--mps-ready-file", default=str(DEFAULT_ROOT / "ready"))
    g.add_argument(
        "--mps-control",
        default=env("NODEAGENT_MPS_CONTROL", "nvidia-cuda-mps-control"),
        help="the control program (env NODEAGENT_MPS_CONTROL)",
    )
    g.add_argument(
        "--mps-exclusive-process",
        action="store_true",
        help="switch the GPUs to EXCLUSIVE_PROCESS while MPS runs",
    )
    g.add_argument(
        "--mps-probe-interval", type=float, default=5.0, help="seconds between health probes"
    )


def mps_settings(ctx: Context) -> MpsSettings:
    a = ctx.args
    if a.mps_devices:
        devices = parse_devices(a.mps_devices)
    else:
        devices = tuple(g.index for g in read_inventory(ctx.session).gpus if not g.mig_current)
    return MpsSettings(
        devices=devices,
        replicas=a.mps_replicas,
        thread_percentage=a.mps_thread_percentage,
        pinned_memory=parse_pinned(a.mps_pinned_memory, devices),
        pipe_dir=Path(a.mps_pipe_dir),
        log_dir=Path(a.mps_log_dir),
        ready_file=Path(a.mps_ready_file),
        control_binary=a.mps_control,
        exclusive_process=a.mps_exclusive_process,
        probe_interval_seconds=a.mps_probe_interval,
    )


def _mps_daemon(ctx: Context, check: bool = True) -> MpsDaemon:
    settings = mps_settings(ctx)
    limits = validate(settings, read_inventory(ctx.session)) if check else Limits(0, {}, "")
    return MpsDaemon(settings, limits, ComputeModeWriter(ctx.session))


def _print_mps(ctx: Context, status: MpsStatus) -> None:
    if ctx.args.output == "json":
        print_json(status.to_dict())
        return
    if not status.running:
        print("MPS control daemon: not running")
        return
    print(f"MPS control daemon: running, pid {status.pid}")
    print(f"  default active thread percentage: {status.thread_percentage}")
    for device, n in sorted(status.pinned_bytes.items()):
        print(
            f"  pinned memory limit, device {device}: {'none' if n is None else f'{n >> 20} MiB'}"
        )
    clients = sum(len(c) for c in status.clients.values())
    print(f"  servers: {status.servers or 'none'}; clients: {clients}")


def cmd_mps(ctx: Context) -> int:
    action = ctx.args.mps_command
    if action == "start":
        status = _mps_daemon(ctx).start()
        _print_mps(ctx, status)
        return 0
    daemon = _mps_daemon(ctx, check=False)
    if action == "stop":
        daemon.stop()
        print("MPS control daemon stopped")
        return 0
    status = daemon.status()
    _print_mps(ctx, status)
    return 0 if status.running else 1
