"""The `nodeagent` command line: the composition root. Nothing imports this package.

`main` takes SIGINT and SIGTERM before anything else is imported (nodeagent.cli.stops); the
parser and the commands load after (nodeagent.cli.commands). Commands import what they use when
they run: the Kubernetes client and gRPC load only for `run --kube`, Prometheus only for `run`
and `metrics`, so `nodeagent status` starts fast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nodeagent.cli.stops import Stopped, Stops, exit_code

Prepared = tuple[str | None, Callable[[Stops], int]]


def main(argv: Sequence[str] | None = None, noted: Sequence[int] = ()) -> int:
    """Run one command; return its exit code (0 ok, 1 false/none, 2 bad input, 3 the GPU or
    the system refused, 4 an internal error, 5 a reboot needed; stopped by a signal: 0 for
    `run`, else 128 + the signal's number). `argv` None: the process's own command line.
    `noted`: stop signals that came before this (`python -m nodeagent` notes them from its
    first line): the command acts on the first as on one that came while it parsed."""

    def prepare() -> Prepared:
        from nodeagent.cli.commands import execute, parse

        parsed = parse(argv)
        if isinstance(parsed, int):
            return None, lambda _stops: parsed
        return parsed.command, lambda stops: execute(parsed, "nodeagent", stops)

    return stoppable(prepare, in_process=argv is not None, noted=noted)


def stoppable(prepare: Callable[[], Prepared], in_process: bool, noted: Sequence[int] = ()) -> int:
    """Run a command line under the stop signals' handler: `prepare` (imports, parsing: a
    stop waits for it, so that it gets the exit code of the command it was given to) returns
    the command's name and body. `in_process`: a caller goes on after it (the handlers before
    are put back), else the process ends (further stop signals are ignored while it does)."""
    stops = Stops().install()
    if noted:  # read after install: a signal from now on is the handler's
        stops.pending = noted[0]
    command: str | None = None
    try:
        with stops.deferred():
            command, body = prepare()
        return body(stops)
    except Stopped as stop:
        return exit_code(stop.signum, command)
    finally:
        stops.finish(restore=in_process)
