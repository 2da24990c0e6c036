"""SIGINT and SIGTERM at any moment of `mig apply` and `run`, as processes on the emulator: the
documented exit code (`run` 0, any other command 128 + the signal), one sentence or nothing,
never a traceback; an interrupted apply leaves the lock free, runs apply-exit, and the next
apply converges.

The delays count from nodeagent's first line (its handler shows in /proc/PID/status), so they
land in the imports, the parsing, the NVML open and the first reconcile whatever the machine's
load. Before that line the interpreter is starting (tens of milliseconds in a development
venv): the signal's default action ends it there, and nodeagent has not run."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Result

DELAYS = (0.0, 0.01, 0.03, 0.1, 0.3)
SIGNALS = (signal.SIGINT, signal.SIGTERM)
F_SETPIPE_SZ = 1031


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _start(args: list[str], **popen: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    proc: subprocess.Popen[str] = subprocess.Popen(
        [sys.executable, "-m", "nodeagent", *args], env=env, text=True,
        stdout=popen.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **popen,  # type: ignore[call-overload]
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not _catches_sigterm(proc.pid):
        assert proc.poll() is None, f"ended before nodeagent's first line: {proc.communicate()}"
        assert time.monotonic() < deadline, "nodeagent's handler never came"
        time.sleep(0.001)
    return proc


def _queued(read_end: int) -> int:
    """The bytes waiting in a pipe."""
    return int.from_bytes(fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"), "little")


def _stopped(args: list[str], signum: int, delay: float) -> tuple[int, str, str]:
    proc = _start(args)
    time.sleep(delay)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=20)
    return proc.returncode, out, err


@pytest.fixture
def mig_file(cli: Callable[..., Result], tmp_path: Path) -> Path:
    path = tmp_path / "mig.yaml"
    path.write_text(cli("--simulate", "h200", "mig", "generate-config").stdout)
    return path


def test_mig_apply_stopped_at_any_moment_says_at_most_one_sentence_and_converges(
    cli: Callable[..., Result], mig_file: Path, tmp_path: Path
) -> None:
    for signum in SIGNALS:
        for delay in DELAYS:
            base = ["--simulate", "h200", "--sim-state", str(tmp_path / f"{signum}-{delay}.json")]
            apply = [*base, "mig", "apply", "-f", str(mig_file), "-c", "all-1g.18gb"]
            code, _out, err = _stopped(apply, signum, delay)
            seen = (signum, delay, code, err)
            assert "Traceback" not in err and "KeyboardInterrupt" not in err, seen
            assert code in (0, 128 + signum), seen  # 0: it was done before the signal came
            assert len(err.splitlines()) <= 1, seen
            if err:
                assert err.startswith(f"nodeagent: stopped by {signum.name} "), seen
            # Consistent: the lock is free, and the next apply finishes the change.
            again = cli(*apply, "--lock-timeout", "0")
            assert again.returncode == 0, (seen, again.stderr)
            check = cli(*base, "mig", "assert", "-f", str(mig_file), "-c", "all-1g.18gb")
            assert check.returncode == 0, (seen, check.stdout)


def test_run_stopped_at_any_moment_exits_0_without_a_word_of_python(tmp_path: Path) -> None:
    state = str(tmp_path / "node.json")
    for signum in SIGNALS:
        for delay in DELAYS:
            args = ["--simulate", "h200", "--sim-state", state, "run", "--metrics-address",
                    "127.0.0.1:0", "--reconcile-interval", "3600"]  # fmt: skip
            code, _out, err = _stopped(args, signum, delay)
            assert code == 0, (signum, delay, err)
            assert "Traceback" not in err and "KeyboardInterrupt" not in err, (signum, delay, err)


def _hooks(tmp_path: Path, start: str) -> Path:
    record = tmp_path / "record"
    hooks = {
        "apply-start": [{"command": "/bin/sh", "args": ["-c", start]}],
        "apply-exit": [{"command": "/bin/sh", "args": ["-c", f"echo $NODEAGENT_RESULT >> {record}"]}],
    }  # fmt: skip
    path = tmp_path / "hooks.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "hooks": hooks}))
    return path


def test_a_stop_during_the_change_waits_for_the_operation_then_ends_it_cleanly(
    cli: Callable[..., Result], mig_file: Path, tmp_path: Path
) -> None:
    """SIGINT while the apply holds the lock (its apply-start hook sends it): the change ends
    before its first NVML operation, apply-exit runs with "failure", the lock is released."""
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    apply = [*base, "mig", "apply", "-f", str(mig_file), "-c", "all-1g.18gb"]
    hooks = _hooks(tmp_path, "kill -INT $PPID")
    proc = subprocess.run([sys.executable, "-m", "nodeagent", *apply, "-k", str(hooks)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == (
        "nodeagent: stopped by SIGINT before the first of 15 NVML operations: the MIG layout"
        " is unchanged\n"
    )
    assert (tmp_path / "record").read_text() == "failure\n"
    status = json.loads(cli(*base, "status", "-o", "json").stdout)
    assert [(g["mig_current"], g["slices"]) for g in status["gpus"]] == [(False, [])]
    assert cli(*apply, "--lock-timeout", "0").returncode == 0


def test_a_stop_between_two_operations_ends_the_change_there(
    cli: Callable[..., Result], mig_file: Path, tmp_path: Path
) -> None:
    """SIGTERM while the apply is blocked writing its progress (a full stdout pipe): the
    operation it reports is done, the next one is not started; exit 143, one sentence."""
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    apply = [*base, "mig", "apply", "-f", str(mig_file), "-c", "all-1g.18gb"]
    read_end, write_end = os.pipe()
    size = fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    os.write(write_end, b"x" * (size - 120))  # room for two lines of progress, not three
    proc = _start(apply, stdout=write_end)
    os.close(write_end)
    deadline = time.monotonic() + 20
    while _queued(read_end) < size - 40:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.01)
    time.sleep(0.1)  # blocked in the third line's write
    proc.send_signal(signal.SIGTERM)
    with os.fdopen(read_end, "rb") as reader:
        printed = reader.read().decode()[size - 120 :].splitlines()
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, err
    done = len(printed)
    assert 0 < done < 15, printed
    assert err == (
        f"nodeagent: stopped by SIGTERM after {done} of 15 NVML operations; the GPUs are"
        " between two configs: apply the config again to finish the change\n"
    )
    again = cli(*apply, "--lock-timeout", "0")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("\n") == 15 - done + 1  # the rest, and the summary


def test_the_handler_is_in_place_before_the_rest_of_nodeagent_is_imported() -> None:
    """The console script imports `nodeagent.cli` before its `main` runs: the package holds
    the handler and nothing heavier (the commands load under it)."""
    probe = (
        "import sys, nodeagent.cli;"
        "print(sorted(m for m in sys.modules if m.startswith('nodeagent')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['nodeagent', 'nodeagent.cli', 'nodeagent.cli.stops']"
