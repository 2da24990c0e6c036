"""Fake host commands for the host duties' tests (nodeagent.host.duties): a script that records
the argv it was run with, one line per run, and exits as told; and whether a process a command
left behind has ended."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path


def fake_command(folder: Path, name: str, exit_code: int = 0, says: str = "") -> Path:
    """Write `folder/name`: it appends "<name> <args>" to `folder/name.argv`, prints `says`
    and exits `exit_code`. Returns the script; recorded() reads what it recorded."""
    log = folder / f"{name}.argv"
    script = folder / name
    script.write_text(
        f'#!/bin/sh\necho "$(basename "$0")${{*:+ $*}}" >> "{log}"\n'
        + (f"echo '{says}'\n" if says else "")
        + f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def recorded(script: Path) -> list[str]:
    """The command lines `script` (made by fake_command) was run with, in order."""
    log = script.with_name(script.name + ".argv")
    return log.read_text().splitlines() if log.exists() else []


def leaving_a_child(pidfile: Path) -> str:
    """A command line that starts a child (a 60 s sleep), writes the child's pid to `pidfile`
    and sleeps 60 s itself: a command that outlives its timeout and leaves a child behind."""
    script = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    return f'{sys.executable} -c "{script}"'


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` has ended within `seconds`: not there, or a zombie waiting for a
    reaper (a container may have none)."""
    deadline = time.monotonic() + seconds
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
