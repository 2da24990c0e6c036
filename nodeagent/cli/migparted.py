"""`nvidia-mig-parted`: mig-parted's command line (cmd/nvidia-mig-parted at bd7160f) on
nodeagent's `mig` commands, so scripts written for it run unchanged; and the MIG_PARTED_*
variables, which `nodeagent mig` reads too.

    nvidia-mig-parted [-d] apply -f config.yaml -c all-1g.10gb [-k hooks.yaml] [-m] [-s]
    nvidia-mig-parted [-d] assert -f config.yaml -c all-1g.10gb [-m] [-a]
    nvidia-mig-parted [-d] export [-o yaml|json] [-l current]
    nvidia-mig-parted [-d] generate-config [-o yaml|json] [-f FILE]

As mig-parted: its success lines on stdout, exit 0 on success and 1 on any failure (an
assertion that does not hold, a bad file, NVML refusing); a flag or variable overrides nothing
given on the command line. Where nodeagent differs: `checkpoint` and `restore` are refused
(exit 2), and an error is one sentence on stderr, not a logrus line.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodeagent import __version__
from nodeagent.base.errors import ConfigError

if TYPE_CHECKING:
    from nodeagent.cli.common import Context

PROG = "nvidia-mig-parted"
NOT_HONOURED = 2  # a mig-parted command nodeagent does not have
# Go's strconv.ParseBool, as mig-parted's BoolFlag reads a variable
TRUE_WORDS = ("1", "t", "T", "TRUE", "true", "True")
FALSE_WORDS = ("0", "f", "F", "FALSE", "false", "False")
# MIG_PARTED_* -> the NODEAGENT_* setting it stands in for, where that one is not set
SETTING_VARIABLES = {
    "MIG_PARTED_CONFIG_FILE": "NODEAGENT_MIG_CONFIG_FILE",
    "MIG_PARTED_SELECTED_CONFIG": "NODEAGENT_MIG_CONFIG",
    "MIG_PARTED_HOOKS_FILE": "NODEAGENT_MIG_HOOKS_FILE",
}
# MIG_PARTED_* -> the flag it stands in for, where the flag is not given
SWITCH_VARIABLES = {
    "MIG_PARTED_DEBUG": "debug",
    "MIG_PARTED_SKIP_RESET": "skip_reset",
    "MIG_PARTED_MODE_CHANGE_ONLY": "mode_only",
    "MIG_PARTED_VALID_CONFIG": "valid_config",
}
TEXT_VARIABLES = {
    "MIG_PARTED_OUTPUT_FORMAT": "output_format",
    "MIG_PARTED_CONFIG_LABEL": "config_label",
    "MIG_PARTED_OUTPUT_FILE": "output_file",
}
NOT_HONOURED_COMMANDS = {
    "checkpoint": "nodeagent keeps no MIG checkpoint file",
    "restore": "nodeagent keeps no MIG checkpoint file",
}


def _switch(name: str, value: str) -> bool:
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean: true or false (or 1, 0, t, f)")


def read_mig_parted_variables(ctx: Context) -> None:
    """Apply the MIG_PARTED_* variables the command declared (mig-parted's EnvVars of that
    command): each fills in what no flag gave; an empty one counts as unset, as in
    mig-parted. Raises ConfigError for a switch that is not a boolean."""
    args, environ = ctx.args, ctx.environ
    for name in args.mig_parted_env:
        value = environ.get(name, "")
        if not value:
            continue
        if name in SETTING_VARIABLES:
            environ.setdefault(SETTING_VARIABLES[name], value)
        elif name in SWITCH_VARIABLES:
            dest = SWITCH_VARIABLES[name]
            if not getattr(args, dest):
                setattr(args, dest, _switch(name, value))
        elif getattr(args, TEXT_VARIABLES[name]) is None:
            setattr(args, TEXT_VARIABLES[name], value)


def _not_honoured(args: argparse.Namespace) -> int:
    command = args.mig_command
    print(
        f"{PROG}: '{command}' is not supported by nodeagent ({NOT_HONOURED_COMMANDS[command]});"
        " `nvidia-mig-parted export` saves the geometry and `apply` brings it back",
        file=sys.stderr,
    )
    return NOT_HONOURED


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """mig-parted's command line: -d/--debug, -v/--version, its commands and flags, and
    nodeagent's node settings (--simulate, ...)."""
    from nodeagent.cli.common import add_setting_flags
    from nodeagent.cli.mig import add_mig_commands

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Manage MIG partitions across the full set of NVIDIA GPUs on a node"
        " (nodeagent's mig-parted compatible command line).",
    )
    parser.add_argument(
        "-v", "--version", action="version", version=f"{PROG} version {__version__} (nodeagent)"
    )
    parser.add_argument(
        "-d", "--debug", action="store_true", help="debug logging (MIG_PARTED_DEBUG)"
    )
    add_setting_flags(parser, ["node"])
    parser.set_defaults(dialect="mig-parted", mig_parted_env=())
    sub = parser.add_subparsers(dest="mig_command", metavar="COMMAND")
    sub.required = True
    add_mig_commands(sub)
    for command in NOT_HONOURED_COMMANDS:
        p = sub.add_parser(command, help="not supported by nodeagent (exit 2)")
        p.add_argument("-f", "--checkpoint-file", help=argparse.SUPPRESS)
        if command == "restore":
            p.add_argument("-k", "--hooks-file", help=argparse.SUPPRESS)
            p.add_argument("-m", "--mode-only", action="store_true", help=argparse.SUPPRESS)
        p.set_defaults(func=_not_honoured, groups=("node",))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one mig-parted command line; 0 on success, 1 on any failure as mig-parted (2: a
    mig-parted command nodeagent does not have; stopped by a signal: 128 + its number)."""
    from nodeagent.cli import Prepared, stoppable

    def prepare() -> Prepared:
        from nodeagent.cli.commands import execute

        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # argparse printed its message; -h and -v exit 0
            code = 0 if exc.code in (0, None) else 1
            return None, lambda _stops: code
        if args.func is _not_honoured:
            return None, lambda _stops: _not_honoured(args)
        return "mig", lambda stops: _as_mig_parted(execute(args, PROG, stops))

    return stoppable(prepare, in_process=argv is not None)


def _as_mig_parted(code: int) -> int:
    return code if code in (0, 130) else 1
