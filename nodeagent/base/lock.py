"""The node-wide MIG writer lock: one `flock` on a file, held by `nodeagent mig apply` and by
the agent's apply step, so two writers never interleave their NVML operations. `held_lock` is
its wait, shared with the ownership record's lock (nodeagent.state.owners).

The holder writes its pid into the file, so a waiter that gives up can say who holds it. The
kernel drops an flock when its holder dies, so a killed writer never leaves the node locked.
The worker threads of one process (the DRA driver's prepares, side by side) queue on a lock of
their own before the file's, so the lock passes between them at once; a holder in another
process is tried every POLL_SECONDS (the main thread, where signal handlers run, only tries).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nodeagent.base.errors import AgentError, ConfigError, Interrupted, LockHeld
from nodeagent.base.files import open_lock_file
from nodeagent.base.logs import get_logger

log = get_logger("nodeagent.base.lock")
LOCK_NAME = "mig-writer.lock"
POLL_SECONDS = 0.05  # a waiter's tries of a lock another process holds
_TURNS: dict[str, threading.Lock] = {}  # held_lock's in-process queue, one lock per path
_TURNS_GUARD = threading.Lock()


def lock_path(run_dir: Path, sim_state: Path | None, simulate: bool) -> Path | None:
    """Where the lock lives: beside the emulator's state file under --simulate (the state is
    what two writers would share), else in the run directory. An emulator without a state
    file lives in one process only: no lock."""
    if simulate:
        return None if sim_state is None else sim_state.with_name(f".{sim_state.name}.lock")
    return run_dir / LOCK_NAME


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode(errors="replace").strip()
    except OSError:
        return "unknown"
    return text or "unknown"


@contextlib.contextmanager
def mig_writer_lock(
    path: Path | None,
    timeout_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Hold the lock for the body; wait up to `timeout_seconds` for another holder. Raises
    LockHeld naming the holder's pid; ConfigError when the lock path is not a regular file
    (a link, a device node, a FIFO, a folder) or cannot be opened; AgentError (exit 3) when
    the system refuses it (a full disk, a read-only file system)."""
    if path is None:
        yield
        return
    with held_lock(path, "the MIG writer lock", "another MIG writer holds", timeout_seconds,
                   sleep=sleep, clock=clock):  # fmt: skip
        yield


@contextlib.contextmanager
def held_lock(
    path: Path,
    what: str,
    holder_words: str,
    timeout_seconds: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    stopped: Callable[[], int] = lambda: 0,
    waited_before: float = 0.0,
) -> Iterator[None]:
    """Hold the flock on `path` (`what` names it) for the body, this process's pid written in
    it; wait up to `timeout_seconds` for another holder, giving way as soon as `stopped()`
    names a stop signal. `waited_before`: the seconds one wait already spent on an earlier lock (the
    MIG writer lock before the record's), counted in what LockHeld says. Raises LockHeld
    ("<holder_words> <path> (pid N); gave up after T s"), Interrupted (exit 128 + the
    signal's number),
    ConfigError (not a regular file, cannot be opened), AgentError (the system refused)."""
    fd = open_lock_file(path, what)
    # Not in the main thread: a signal handler runs there and may raise (cli/stops.py) between
    # taking the turn and noting it, which would keep it taken for good; the flock alone
    # serves the main thread (a close drops it, whatever is raised).
    turn = None if threading.current_thread() is threading.main_thread() else _turn(path)
    took_turn = False
    try:
        deadline = clock() + timeout_seconds
        waited = False

        def wait_on() -> None:
            """Once more: the wait said once, a stop signal or the deadline ends it."""
            nonlocal waited
            if not waited:
                log.info("lock.waiting", lock=what, path=str(path), holder=_holder(fd))
                waited = True
            if signum := stopped():
                raise Interrupted(
                    f"stopped by {signal.Signals(signum).name} while waiting for {what} {path};"
                    " nothing was changed",
                    signum,
                )
            if clock() >= deadline:
                raise LockHeld(
                    f"{holder_words} {path} (pid {_holder(fd)}); gave up after"
                    f" {round(waited_before + timeout_seconds, 2):g} s"
                )

        # This process's threads queue on a lock of their own first, so the next one takes the
        # file's lock the moment its holder lets go (not at its next try, up to POLL_SECONDS
        # later: a burst of a kubelet's prepares would wait a try per claim, in step).
        if turn is not None:
            took_turn = turn.acquire(blocking=False)
            while not took_turn:
                wait_on()
                took_turn = turn.acquire(timeout=POLL_SECONDS)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise ConfigError(f"cannot lock {path}: {err.strerror}") from err
            wait_on()
            sleep(POLL_SECONDS)  # another process holds it: the kernel says so at a try only
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as err:  # a full disk: refused by the system, nothing done yet
            fcntl.flock(fd, fcntl.LOCK_UN)
            raise AgentError(
                f"cannot write this process's pid into {what} {path}: {err.strerror}"
            ) from err
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # the lock is released all the same
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        try:
            os.close(fd)
        finally:
            if took_turn and turn is not None:
                turn.release()


def _turn(path: Path) -> threading.Lock:
    """The lock this process's threads take before the file's at `path` (one per path)."""
    with _TURNS_GUARD:
        return _TURNS.setdefault(os.path.abspath(path), threading.Lock())
