"""Shared by the commands: the parsed flags, the settings, the NVML session, output helpers."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NoReturn

from nodeagent.base.errors import ConfigError, NvmlError
from nodeagent.base.logs import get_logger
from nodeagent.cli.stops import Stops
from nodeagent.nvml.codes import DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND
from nodeagent.settings import GROUPS, SPECS, Settings, Source, Spec, load

DEFAULTS = Settings()  # every setting's default, shown in --help

MIB = 1024 * 1024
log = get_logger("nodeagent")


@dataclass
class Context:
    """What every command gets: the parsed flags, its settings (loaded once, from the groups
    the command declared), a lazily opened NVML session, and the stop signals' handler."""

    args: argparse.Namespace
    environ: dict[str, str]
    stops: Stops | None = None
    _settings: Settings | None = None
    _sources: dict[str, Source] | None = None
    _lib: Any = None
    _session: Any = None

    def changing(self) -> AbstractContextManager[None]:
        """Around a change of the node outside the pipeline (an MPS daemon started or
        stopped): a stop signal waits for it to end (nodeagent.cli.stops)."""
        return self.stops.deferred() if self.stops is not None else contextlib.nullcontext()

    @property
    def groups(self) -> tuple[str, ...]:
        groups: tuple[str, ...] = getattr(self.args, "groups", ("node",))
        return groups

    def load_settings(self) -> Settings:
        """Flags -> environment -> settings file -> defaults, for this command's groups. The
        settings file may be a pipe the first time (`--config <(generate)`); a reload (`run`'s
        SIGHUP) reads a regular file only: a pipe read again gives nothing, and no settings
        would silently become the defaults. Raises ConfigError."""
        from nodeagent.base.files import is_pipe

        before = self._settings
        if before is not None and before.file and is_pipe(before.file):
            raise ConfigError(
                f"settings file {before.file} is a pipe, read once when the agent started: a"
                " reload reads a regular file; the settings stay as they were"
            )
        file = getattr(self.args, "settings_file", None)
        settings, sources = load(vars(self.args), self.environ, file, self.groups)
        self._settings, self._sources = settings, sources
        return settings

    @property
    def settings(self) -> Settings:
        return self._settings if self._settings is not None else self.load_settings()

    @property
    def sources(self) -> dict[str, Source]:
        if self._sources is None:
            self.load_settings()
        assert self._sources is not None
        return self._sources

    @property
    def simulate(self) -> str | None:
        return self.settings.node.simulate

    @property
    def lib(self) -> Any:
        if self._lib is None:
            node = self.settings.node
            if node.simulate:
                from nodeagent.sim import open_emulator

                self._lib = open_emulator(node.simulate, node.sim_state)
            else:
                from nodeagent.nvml import load_real_library

                self._lib = load_real_library()
        return self._lib

    @property
    def session(self) -> Any:
        """The process's NvmlSession over the real library or the emulator."""
        from nodeagent.nvml import open_session

        if self._session is None:
            try:
                self._session = open_session(self.lib)
            except NvmlError as err:
                if err.code in (DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND):
                    raise NvmlError(
                        err.code,
                        err.function,
                        f"{err.nvml_message}; no NVIDIA driver is loaded here (one still"
                        " loading: node.nvml-wait waits for it; no GPU: --simulate SPEC runs"
                        " on the built-in emulator)",
                    ) from err
                raise
        return self._session

    def emulator(self, command: str) -> Any:
        from nodeagent.sim import SimulatedNvml

        if not self.simulate:
            raise ConfigError(f"'nodeagent sim {command}' needs --simulate SPEC (the emulator)")
        if not self.settings.node.sim_state:
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


def output_flag(p: argparse.ArgumentParser, *choices: str) -> None:
    p.add_argument(
        "--output",
        "-o",
        choices=choices or ("text", "json"),
        default=choices[0] if choices else "text",
        help="output format; a failure is printed as {error, reason, retry} in JSON",
    )


def reset_for(settings: Settings, lib: Any) -> Any:
    """The function that resets one GPU whose MIG mode stays pending (Ampere): the configured
    command, else the emulator's reset under --simulate, else `nvidia-smi -r -i {index}`."""
    from nodeagent.mig.apply import command_reset

    template = settings.mig.reset_command
    if template:
        try:
            return command_reset(template)
        except ValueError as err:
            raise ConfigError(f"mig.reset-command {template!r}: {err}") from err
    if settings.node.simulate and hasattr(lib, "reset"):
        return lib.reset
    return command_reset()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default, where it has one to say: not for a flag without a
    value (None), a switch that is off, or an empty list (the settings' flags say theirs in
    their help text, from the settings' defaults: `setting_default`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if default is None or default is False or default == [] or default == ():
            return action.help
        return super()._get_help_string(action)


class UsageError(SystemExit):
    """argparse's usage error (it printed its message and the usage): exit 2, `message` kept
    for `--output json`."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class Parser(argparse.ArgumentParser):
    """nodeagent's parsers (its subcommands' too): defaults in --help, usage errors kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        try:
            super().error(message)  # the usage and "prog: error: message" on stderr, as always
        except SystemExit:
            raise UsageError(message) from None
        raise AssertionError("argparse's error() returned")  # pragma: no cover


def setting_default(spec: Spec) -> str | None:
    """A setting's default as its flag takes it (what the settings group's dataclass holds);
    None where there is none to show: unset, an empty list, a switch that is off."""
    value = getattr(getattr(DEFAULTS, spec.group), spec.field)
    if value is None or value == "" or (spec.switch and value is False):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):  # NAME[=SELECTOR] items, ';'-separated
        if not value or any(value.values()):
            return None
        return ";".join(value)
    if isinstance(value, (tuple, list)):
        if not value or not all(isinstance(v, (str, int)) for v in value):
            return None
        return (";" if spec.repeat else ",").join(str(v) for v in value)
    return str(value)


def add_setting_flags(
    p: argparse.ArgumentParser,
    groups: Iterable[str],
    names: Mapping[str, Sequence[str]] | None = None,
    skip: Iterable[str] = (),
) -> None:
    """One flag per setting of `groups` (from settings.SPECS); `names` overrides a setting's
    flag names. No default is set here: the loader knows them, and reads the environment."""
    names, skipped = names or {}, set(skip)
    wanted = set(groups)
    for group in GROUPS:
        specs = [s for s in SPECS if s.group == group and s.group in wanted]
        specs = [s for s in specs if s.flag and s.dotted not in skipped]
        if not specs:
            continue
        target = p.add_argument_group(f"{group} settings") if group != "node" else p
        for spec in specs:
            assert spec.flag is not None
            flags = list(names.get(spec.dotted) or ([spec.short] if spec.short else []))
            flags += [] if spec.dotted in names else [spec.flag]
            default = setting_default(spec)
            shown = f"; default: {default}" if default is not None else ""
            help_text = f"{spec.help} ({'; '.join(spec.env)}; {spec.dotted}{shown})"
            help_text = help_text.replace("%", "%%")  # argparse formats help with %
            kw: dict[str, Any] = {"dest": spec.dest, "default": None, "help": help_text}
            if spec.switch:
                kw.update(action="store_const", const="true")
            elif spec.repeat:
                kw.update(action="append", metavar="VALUE")
            else:
                kw.update(metavar=spec.key.split("-")[-1].upper())
            target.add_argument(*flags, **kw)
