"""Shared by the commands: the parsed flags, the NVML session, output helpers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from nodeagent.errors import ConfigError, NvmlError
from nodeagent.mig.apply import DEFAULT_RESET_COMMAND, Reset, command_reset
from nodeagent.nvml import NvmlSession, load_real_library, open_session
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


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("text", "json"), default="text")


def reset_for(ctx: Context) -> Reset:
    template: str | None = getattr(ctx.args, "reset_command", None)
    if template:
        try:
            return command_reset(template)
        except ValueError as err:
            raise ConfigError(f"--reset-command: {err}") from err
    if ctx.simulate:
        emulator = ctx.lib
        assert isinstance(emulator, SimulatedNvml)
        return emulator.reset
    return command_reset()


def add_mig_config_flags(p: argparse.ArgumentParser, what: str = "") -> None:
    """-f/--file and -c/--config, with the environment variables that stand in for them."""
    what = f" {what}" if what else ""
    p.add_argument(
        "-f",
        "--file",
        default=os.environ.get("NODEAGENT_MIG_CONFIG_FILE") or None,
        help=f"mig-parted v1 config file{what}, - for stdin (env NODEAGENT_MIG_CONFIG_FILE)",
    )
    p.add_argument(
        "-c",
        "--config",
        default=os.environ.get("NODEAGENT_MIG_CONFIG") or None,
        help=f"name of the config in the file{what} (env NODEAGENT_MIG_CONFIG)",
    )


def add_reset_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reset-command",
        default=os.environ.get("NODEAGENT_MIG_RESET_COMMAND") or None,
        help="run for a GPU whose MIG mode stays pending (Ampere); {index} is the GPU"
        f" (default '{DEFAULT_RESET_COMMAND}'; env NODEAGENT_MIG_RESET_COMMAND)",
    )
