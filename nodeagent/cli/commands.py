"""The `nodeagent` command line's parser and the dispatch to its commands (nodeagent.cli's
`main` runs them under the stop signals' handler)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence

from nodeagent import __version__
from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.logs import configure_logging, printable
from nodeagent.cli.common import (
    Context,
    Parser,
    UsageError,
    add_setting_flags,
    output_flag,
    print_json,
)
from nodeagent.cli.dra import add_dra_parser
from nodeagent.cli.mig import add_mig_parser
from nodeagent.cli.migparted import read_mig_parted_variables
from nodeagent.cli.plan import add_plan_parser
from nodeagent.cli.run import add_run_parsers
from nodeagent.cli.sharing import add_sharing_parser
from nodeagent.cli.status import (
    add_sim_health_parsers,
    cmd_sim_attach,
    cmd_sim_detach,
    cmd_sim_reboot,
    cmd_sim_reset,
    cmd_status,
)
from nodeagent.cli.stops import Stopped, Stops

INTERNAL_ERROR = 4
OUTPUT_FLAGS = ("--output", "--output-format")  # -o's long names (mig's export: both)


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """The whole command line, built once per process (about 30 ms: argparse looks up message
    catalogs and the terminal for every parser and flag). Parsing does not change it, so
    callers that parse many command lines in one process (the tests) share it."""
    parser = Parser(
        prog="nodeagent",
        description="GPU node agent: MIG geometry, MPS, node labels, Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    parser.add_argument(
        "-d",
        "--debug",
        action="store_true",
        help="debug logging and the traceback of an internal error (mig-parted's -d)",
    )
    add_setting_flags(parser, ["node"])
    parser.set_defaults(dialect="nodeagent", mig_parted_env=())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("status", help="GPUs, MIG mode, slices, memory and processes")
    output_flag(p)
    p.set_defaults(func=cmd_status, groups=("node",))

    add_mig_parser(sub)
    add_sharing_parser(sub)
    add_plan_parser(sub)
    add_run_parsers(sub)
    add_dra_parser(sub)

    sim = sub.add_parser("sim", help="drive the emulator as a user would (needs --simulate)")
    simsub = sim.add_subparsers(dest="sim_command", metavar="SIMCOMMAND")
    simsub.required = True
    p = simsub.add_parser("attach", help="start an emulated process on a GPU or MIG device")
    p.add_argument("--device", required=True, help="GPU index, GPU UUID or MIG UUID")
    p.add_argument("--pid", required=True, type=int)
    p.add_argument("--memory-mib", type=int, default=1024, help="GPU memory it holds, MiB")
    p.add_argument("--load", type=float, default=1.0, help="share of the SMs it keeps busy, 0-1")
    p.set_defaults(func=cmd_sim_attach)
    p = simsub.add_parser("detach", help="end an emulated process")
    p.add_argument("--pid", required=True, type=int)
    p.set_defaults(func=cmd_sim_detach)
    p = simsub.add_parser("reset", help="reset one emulated GPU (nvidia-smi -r -i N)")
    p.add_argument("--gpu", "-i", required=True, type=int)
    p.set_defaults(func=cmd_sim_reset)
    p = simsub.add_parser("reboot", help="reboot the emulated node (a pending MIG mode applies)")
    p.set_defaults(func=cmd_sim_reboot)
    add_sim_health_parsers(simsub)
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The parsed command line, or the exit code argparse ended with (it printed why: 2 on
    bad flags, 0 for --help and --version). A command line that asks for `--output json`
    gets its usage error on stdout too, as every other failure: {error, reason, retry}."""
    try:
        return build_parser().parse_args(argv)
    except UsageError as exc:
        if wants_json(sys.argv[1:] if argv is None else argv):
            print_json({"error": exc.message, "reason": ConfigError.reason, "retry": False})
        return 2
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2


def wants_json(argv: Sequence[str]) -> bool:
    """Whether a command line (one argparse refused) asks for JSON output: `--output json`,
    `--output=json`, `-o json`, `-ojson`, or an abbreviation argparse takes (`--out json`)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return False
        name, eq, value = arg.partition("=")
        if name.startswith("--o") and any(f.startswith(name) for f in OUTPUT_FLAGS):
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        elif arg.startswith("-o") and not arg.startswith("--"):
            value = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
        else:
            continue
        if value == "json":
            return True
    return False


def execute(args: argparse.Namespace, prog: str, stops: Stops | None = None) -> int:
    """Run the parsed command (`nodeagent` or `nvidia-mig-parted`, named `prog` in errors);
    `stops`: the stop signals' handler, for the commands that change the node."""
    func: Callable[[Context], int] = args.func
    ctx = Context(args, dict(os.environ), stops)
    try:
        read_mig_parted_variables(ctx)
        settings = ctx.load_settings()
        level = "debug" if args.debug else settings.node.log_level
        configure_logging(level, settings.node.log_format)
        return func(ctx)
    except AgentError as err:  # names and values from files and flags: shown escaped, capped
        print(f"{prog}: {printable(str(err), keep_newlines=True)}", file=sys.stderr)
        if vars(args).get("output") == "json":  # a script reads the failure as it reads output
            print_json({"error": str(err), "reason": err.reason, "retry": err.retry})
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodeagent status | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # a bug: one line, the traceback only with --debug
        stop = _stop_within(err)
        if stop is not None:  # a stop raised inside a class's creation (Python < 3.12 wraps
            raise stop from None  # what __set_name__ raises in RuntimeError): it is a stop
        if args.debug:
            raise
        text = printable(f"{type(err).__name__}: {err}", keep_newlines=True)
        print(f"{prog}: internal error: {text} (--debug shows where)", file=sys.stderr)
        return INTERNAL_ERROR


def _stop_within(err: BaseException) -> Stopped | None:
    """The stop signal's Stopped that `err` wraps, if any (its causes and contexts, bounded)."""
    seen: BaseException | None = err
    for _ in range(8):
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if isinstance(seen, Stopped):
            return seen
    return None
