"""Signals for `nodeagent run`: SIGTERM/SIGINT stop the agent, SIGHUP reloads its settings
(`Reloader`: one attempt at a time, tried again when the system refused it).

The Python-level handlers do nothing but note the signal. Everything else happens on a thread
of its own: the interpreter's C-level handler writes each signal's number to a pipe
(`signal.set_wakeup_fd`), and the `signals` thread reads it and sets the flags and events.
A handler that called `Event.set()` itself ran on the main thread between two bytecodes, also
while that thread was inside the same Event's lock (waiting on it, clearing it): a burst of
SIGHUPs then SIGTERM wedged the agent for good, and handlers nested into each other.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import UnreadableFile, read_regular
from nodeagent.base.logs import configure_logging
from nodeagent.cli.common import Context
from nodeagent.host.sdnotify import Notifier

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Signals:
    """Install the handlers (main thread only); `close()` puts the previous ones back and ends
    the thread.

    `stop` and `reload` are flags the main loop reads; `wake` is set after each signal;
    `on_stop` is called (on the `signals` thread) when a stop is asked for, so that retries
    and waits elsewhere end at once."""

    def __init__(self, on_stop: Callable[[], None] = lambda: None) -> None:
        self.on_stop = on_stop
        self.wake = threading.Event()
        self.stop = False
        self.reload = False
        self.last_signal = 0  # what a handler records; the thread below does the work
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a full pipe drops a byte, never blocks
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {s: signal.signal(s, self._note) for s in (*STOP_SIGNALS, signal.SIGHUP)}
        self._thread = threading.Thread(target=self._read, name="signals", daemon=True)
        self._thread.start()

    def _note(self, signum: int, _frame: object) -> None:
        self.last_signal = signum

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return  # closed: the agent is done
            self.handle(data)

    def handle(self, signums: bytes) -> None:
        """Act on signal numbers as the wakeup pipe delivers them (a burst may arrive as one
        read, or, past the pipe's buffer, with some bytes dropped: a flag is set at least once)."""
        if any(s in STOP_SIGNALS for s in signums):
            self.stop = True
            self.on_stop()
        if signal.SIGHUP in signums:
            self.reload = True
        self.wake.set()

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._write_fd)  # the thread reads end-of-file
        self._thread.join(1)
        with contextlib.suppress(OSError):
            os.close(self._read_fd)


# Errors of the system, not of the file: the same reload works once they are gone.
TRANSIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)
RELOAD_RETRY_SECONDS = (
    1.0,
    30.0,
)  # the first wait before trying a refused reload again; the longest


def _transient(path: str | None) -> OSError | None:
    """The error opening the settings file, where it is one of the system's (no file
    descriptor left: `ulimit -n`, memory): the reload is tried again instead of being lost."""
    if path is None:
        return None
    try:
        read_regular(path, "settings file", 0)
    except UnreadableFile as err:
        if err.errno in TRANSIENT_ERRNOS:
            return OSError(err.errno, os.strerror(err.errno))
    except ConfigError:
        return None
    return None


class Reloader:
    """SIGHUP: the settings file again, the same environment and flags. A reload the system
    refuses is tried again (1 s, doubling up to 30 s), each attempt a log line, and /readyz
    says so meanwhile; a file that is wrong is refused once (logged, the metric says 0, the
    old settings stay)."""

    def __init__(self, ctx: Context, agent: Any, notify: Notifier) -> None:
        self.ctx, self.agent, self.notify = ctx, agent, notify
        self.retry_at: float | None = None
        self.wait_seconds = RELOAD_RETRY_SECONDS[0]

    def due(self, now: float) -> bool:
        return self.retry_at is None or now >= self.retry_at

    def run(self, announced: bool) -> bool:
        """One attempt; returns whether it must be tried again."""
        # Before READY=1 there is no started service to reload: systemd hears nothing.
        if announced:
            monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            self.notify.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")
        try:
            again = self._attempt()
        finally:
            if announced:
                self.notify.send("READY=1")
        return again

    def _attempt(self) -> bool:
        old = self.ctx.settings.node
        refused = _transient(self.ctx.settings.file)
        if refused is not None:
            reason = f"cannot read settings file {self.ctx.settings.file}: {refused.strerror}"
            self.agent.reload_failed(AgentError(reason), retry_seconds=self.wait_seconds)
            self.retry_at = time.monotonic() + self.wait_seconds
            self.wait_seconds = min(self.wait_seconds * 2, RELOAD_RETRY_SECONDS[1])
            return True
        self.retry_at, self.wait_seconds = None, RELOAD_RETRY_SECONDS[0]
        try:
            new = self.ctx.load_settings()
        except AgentError as err:
            self.agent.reload_failed(err)
        else:
            self.agent.reload(new)
            if new.node.log_level != old.log_level:
                configure_logging(new.node.log_level, old.log_format)
        return False
