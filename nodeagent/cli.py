"""The `nodeagent` command line: the composition root. Nothing imports this module."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from nodeagent import __version__
from nodeagent.errors import AgentError, ConfigError, NvmlError
from nodeagent.logs import configure_logging
from nodeagent.nvml import NvmlSession, load_real_library, open_session, read_inventory
from nodeagent.render import render_inventory
from nodeagent.sim import SimulatedNvml, open_emulator

MIB = 1024 * 1024
NVML_DRIVER_NOT_LOADED = 9
NVML_LIBRARY_NOT_FOUND = 12
log = structlog.get_logger("nodeagent")


@dataclass
class Context:
    """What every command gets: the parsed flags and a lazily opened NVML session."""

    args: argparse.Namespace
    _lib: Any = None
    _session: NvmlSession | None = None

    @property
    def simulate(self) -> str | None:
        spec: str | None = self.args.simulate
        return spec

    @property
    def lib(self) -> Any:
        if self._lib is None:
            if self.simulate:
                state = Path(self.args.sim_state) if self.args.sim_state else None
                self._lib = open_emulator(self.simulate, state)
            else:
                self._lib = load_real_library()
        return self._lib

    @property
    def session(self) -> NvmlSession:
        if self._session is None:
            try:
                self._session = open_session(self.lib)
            except NvmlError as err:
                if err.code in (NVML_DRIVER_NOT_LOADED, NVML_LIBRARY_NOT_FOUND):
                    raise NvmlError(
                        err.code,
                        err.function,
                        f"{err.nvml_message}; no NVIDIA driver on this machine"
                        " (use --simulate SPEC to run on the built-in emulator)",
                    ) from err
                raise
        return self._session

    def emulator(self, command: str) -> SimulatedNvml:
        if not self.simulate:
            raise ConfigError(f"'nodeagent sim {command}' needs --simulate SPEC (the emulator)")
        if not self.args.sim_state:
            raise ConfigError(
                f"'nodeagent sim {command}' needs --sim-state PATH, or the change is lost"
                " when the command exits"
            )
        lib = self.lib
        assert isinstance(lib, SimulatedNvml)
        return lib


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def cmd_status(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    if ctx.args.output == "json":
        _print_json(inventory.to_dict())
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


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("text", "json"), default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodeagent",
        description="GPU node agent: MIG geometry, MPS, node labels, Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        default=os.environ.get("NODEAGENT_SIMULATE") or None,
        help="use the built-in GPU emulator, e.g. h200, h200x8, a100-40gbx2,h100-80gb "
        "(env NODEAGENT_SIMULATE)",
    )
    parser.add_argument(
        "--sim-state",
        metavar="PATH",
        default=os.environ.get("NODEAGENT_SIM_STATE") or None,
        help="keep the emulated GPUs' state in this JSON file (env NODEAGENT_SIM_STATE)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument("--log-format", default="auto", choices=("auto", "json", "console"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("status", help="GPUs, MIG mode, slices, memory and processes")
    _output_flag(p)
    p.set_defaults(func=cmd_status)

    sim = sub.add_parser("sim", help="drive the emulator as a user would (needs --simulate)")
    simsub = sim.add_subparsers(dest="sim_command", metavar="SIMCOMMAND")
    simsub.required = True
    p = simsub.add_parser("attach", help="start an emulated process on a GPU or MIG device")
    p.add_argument("--device", required=True, help="GPU index, GPU UUID or MIG UUID")
    p.add_argument("--pid", required=True, type=int)
    p.add_argument("--memory-mib", type=int, default=1024)
    p.add_argument("--load", type=float, default=1.0, help="share of the SMs it keeps busy, 0-1")
    p.set_defaults(func=cmd_sim_attach)
    p = simsub.add_parser("detach", help="end an emulated process")
    p.add_argument("--pid", required=True, type=int)
    p.set_defaults(func=cmd_sim_detach)
    p = simsub.add_parser("reset", help="reset one emulated GPU (nvidia-smi -r -i N)")
    p.add_argument("--gpu", "-i", required=True, type=int)
    p.set_defaults(func=cmd_sim_reset)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 ok, 1 false/none, 2 bad input, 3 GPU refused)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its message (exit 2 on bad flags)
        return int(exc.code) if isinstance(exc.code, int) else 2
    configure_logging(args.log_level, args.log_format)
    func: Callable[[Context], int] = args.func
    try:
        return func(Context(args))
    except AgentError as err:
        print(f"nodeagent: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodeagent status | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
