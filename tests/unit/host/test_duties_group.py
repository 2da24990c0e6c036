"""A host command that outlives mig.hook-timeout is killed with its process group: a child it
started (a `sleep` left behind) does not survive it (issue 39, class 6)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from nodeagent.host.duties import HostDutyError, run_command


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (a container may have none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_timeout_kills_the_command_and_the_child_it_left(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    began = time.monotonic()
    with pytest.raises(HostDutyError, match="did not finish within 1 s"):
        run_command(f'{sys.executable} -c "{script}"', "the CDI refresh command", 1)
    assert time.monotonic() - began < 10  # not held by the child's end of the pipe
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
