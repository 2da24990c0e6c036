"""Running a command the user named (a hook, a CDI refresh or reboot command, the MIG reset
command, a kubeconfig's exec plugin) in a session of its own, so that ending it on a timeout
ends every process it started too: a child left behind would outlive the timeout and hold
the output pipe (and the GPU it was told to reset)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

REAP_SECONDS = 5.0  # after SIGKILL: a group that is gone closes its pipes at once


def run_in_session(
    argv: Sequence[str], timeout_seconds: float, **popen: Any
) -> subprocess.CompletedProcess[Any]:
    """Run `argv` to its end in a new session, as subprocess.run with `popen`'s Popen
    arguments (stdout, stderr, text, env, cwd...). Raises OSError when it cannot start, and
    subprocess.TimeoutExpired once it outlived `timeout_seconds` and its whole process group
    was killed (`kill_group`); any other interruption kills the group too."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group of `proc` (started in a session of its own), then reap it.
    A grandchild that moved to yet another session and still holds the output pipe is not
    waited for."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already, or never its own group leader
        proc.kill()
    try:
        proc.communicate(timeout=REAP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.wait()
