"""Processes the test suite leaves behind: found at the end of the session, reported, ended.

Two ways to know a process is the suite's: the session's pytest process becomes a child
subreaper (Linux prctl), so whatever its tests start, even a daemon that forks twice and calls
setsid (the fake MPS control daemon), is reparented to it and stays its descendant; and every
process inherits MARKER in its environment (a token for this session), which also finds those
that left the tree some other way (a subreaper of their own). Zombies are not leaks: they have
exited (the end of the session reaps the ones reparented to it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MARKER = "PYTEST_NODEAGENT_SESSION"  # not NODEAGENT_*: the cli fixtures drop those
GRACE = "PYTEST_NODEAGENT_LEAK_GRACE"  # seconds a process may take to exit after the tests (5)
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants are reparented to this process instead of init. False where the
    kernel (or the platform) does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _has_marker(pid: int, token: str) -> bool:
    try:
        return f"{MARKER}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(
            b"\0"
        )
    except OSError:
        return False


def _pids() -> Iterable[int]:
    return (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())


def leaked(root: int, token: str) -> dict[int, str]:
    """Running processes that are descendants of `root` or carry the session's marker, with
    their command lines; `root` itself excluded."""
    parents: dict[int, int] = {}
    running: set[int] = set()
    for pid in _pids():
        st = _stat(pid)
        if st is None:
            continue
        parents[pid] = st[1]
        if st[0] not in ("Z", "X"):
            running.add(pid)

    def descends(pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            pid, seen = parents.get(pid, 0), seen + 1
            if pid == root:
                return True
        return False

    found = {}
    for pid in sorted(running - {root}):
        if descends(pid) or _has_marker(pid, token):
            found[pid] = _command(pid)
    return found


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


def wait_for_leaks(
    root: int, token: str, grace_seconds: float = 5.0, sleep: Callable[[float], None] = time.sleep
) -> dict[int, str]:
    """The leaked processes still running after `grace_seconds` (one told to quit last may
    still be exiting)."""
    deadline = time.monotonic() + grace_seconds
    while True:
        found = leaked(root, token)
        reap_zombies()
        if not found or time.monotonic() >= deadline:
            return found
        sleep(0.1)


def end(pids: Iterable[int]) -> None:
    """SIGKILL the leaked processes, then reap those that were reparented to this process."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    reap_zombies()


def reap_zombies() -> None:
    """Reap exited children that no Popen object waits for (orphans reparented to us)."""
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[0] == "Z" and st[1] == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
