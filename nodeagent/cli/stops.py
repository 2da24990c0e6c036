"""SIGINT and SIGTERM from a command's first line to its exit (`run` hands them to
nodeagent.cli.signals once it starts, and back when it ends).

A stop signal ends the command where it is, with nothing printed, while the command only reads:
importing, parsing its flags, loading its settings, opening NVML, observing and planning. The
handler raises Stopped there (main turns it into the exit code). While the command changes the
node (`deferred()`: the MIG writer lock held, an MPS daemon started or stopped) the handler only
notes the signal: the change stops at its next operation boundary (`requested()`, checked by
nodeagent.mig.apply.execute), or ends as it would, its lock released and its hooks run, and the
stop takes effect then. Importing and parsing are deferred too, so a stop during them gets the
exit code of the command it was given to.

Exit codes: `run` 0 (a stop is its way to end); any other command 128 + the signal's number (130
for Ctrl-C, 143 for SIGTERM), as a shell reports a command a signal ended. Before the
interpreter runs nodeagent's first line (its first few milliseconds) the signal's default action
ends the process: nothing of nodeagent ran, nothing changed.

This module imports only the standard library's `signal`, `contextlib` and `threading`: it is
in place before the rest of nodeagent is imported.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """A stop signal ended the command while it was only reading (or once its change was done).
    A BaseException, as KeyboardInterrupt: no `except Exception` of the command's swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Stops:
    """The process's SIGINT/SIGTERM handler for one command (main thread only; elsewhere
    `install()` changes nothing and the signals keep what they had)."""

    def __init__(self) -> None:
        self.pending = 0  # a stop signal noted while deferred, not yet acted on
        self.stopping = False  # acted on once: further signals are noted, never raised
        self._depth = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> Stops:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def finish(self, restore: bool) -> None:
        """The command is done: put the previous handlers back (`restore`: a caller in this
        process goes on), or ignore further stop signals while the interpreter ends (the
        command's exit code stands)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if restore else signal.SIG_IGN)
        self._previous = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self._depth or self.stopping:
            self.pending = self.pending or signum
            return
        self.stopping = True
        raise Stopped(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Note stop signals instead of acting on them in the body. A signal the body did not
        act on (`requested()`) takes effect when the outermost deferral ends without an error:
        Stopped is raised then. After an error the error is what the command says."""
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if not self._depth and self.pending:
                self.stopping = True
            raise
        self._depth -= 1
        if not self._depth and self.pending and not self.stopping:
            self.stopping = True
            raise Stopped(self.pending)

    def requested(self) -> int:
        """The stop signal noted and not yet acted on (0: none). The caller acts on it: a
        nonzero answer is given once."""
        if self.stopping or not self.pending:
            return 0
        self.stopping = True
        return self.pending


def exit_code(signum: int, command: str | None) -> int:
    """What a stop signal makes of the command's exit: 0 for `run`, else 128 + its number."""
    return 0 if command == "run" else 128 + signum
