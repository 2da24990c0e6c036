"""The session-end check of tests/conftest.py: a suite whose tests leave a process running fails,
names the process, and ends it; one that cleans up passes. Run as a user runs the suite, in a
child pytest (alone and under xdist) over a test file made here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO
from tests.support.leaks import GRACE, MARKER

LEAKY = """
import subprocess, sys

def test_leaves_a_child():
    subprocess.Popen(["sleep", "{first}"])

def test_leaves_a_daemon_that_forked_twice():
    # setsid in a backgrounded shell: the shell exits, the daemon is an orphan in a session
    subprocess.run(["sh", "-c", "setsid sleep {second} >/dev/null 2>&1 &"], check=True)
"""
TIDY = """
import subprocess

def test_cleans_up():
    proc = subprocess.Popen(["sleep", "3597"])
    proc.kill()
    proc.wait()
"""
CONFTEST = "from tests.conftest import pytest_configure, pytest_sessionfinish  # noqa: F401\n"


def _suite(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != MARKER}  # a session of its own
    env["PYTHONPATH"] = str(REPO)
    # What the leaky suites leave never exits: the 5 s a real suite gives a process told to
    # quit last would only be waited out here.
    env[GRACE] = "0.3"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), str(tmp_path), *flags],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def _still_running(report: str) -> list[int]:
    """The pids the report names ("pid N: command") that are still running (not a zombie):
    only these, as other suites on the machine may run the same commands."""
    running = []
    for pid in (int(n) for n in re.findall(r"pid (\d+): ", report)):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            running.append(pid)
    return running


# Each case's sleeps last a time of their own: the cases may run at once (xdist).
@pytest.mark.parametrize(("flags", "first", "second"), [((), 3599, 3598),
                         (("-n", "2"), 3589, 3588)], ids=["alone", "xdist"])  # fmt: skip
def test_a_suite_that_leaks_fails_naming_what_it_left(
    tmp_path: Path, flags: tuple[str, ...], first: int, second: int
) -> None:
    res = _suite(tmp_path, LEAKY.format(first=first, second=second), *flags)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "2 passed" in res.stdout
    assert "2 processes started by the tests were still running at the end:" in res.stdout
    assert f"sleep {first}" in res.stdout and f"sleep {second}" in res.stdout
    assert re.findall(r"pid \d+: ", res.stdout) and _still_running(res.stdout) == []  # ended


def test_a_suite_that_cleans_up_passes(tmp_path: Path) -> None:
    # Alone: that xdist's workers (the controller's children) are not taken for leaks is what
    # the xdist case above shows by naming exactly the two sleeps.
    res = _suite(tmp_path, TIDY)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "still running" not in res.stdout
