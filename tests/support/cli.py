"""Running nodeagent's commands in a test (in process or as a process) and reading what they
said: Result, assert_one_error, captured_logs; the fake MPS control daemon's helpers."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import structlog
from structlog.testing import capture_logs

from nodeagent.base.logs import configure_logging
from nodeagent.nvml.session import _sessions as session_registry

REPO = Path(__file__).resolve().parents[2]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


def c_string(text: str) -> str:
    """`text` as a C string literal for a -D definition (no shell in between)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stop_mps_daemon(binary: str, pipe_dir: Path, ready_file: Path) -> None:
    """End the (fake) MPS control daemon a test left in `pipe_dir`, as `nodeagent mps stop`
    does: `quit`, wait, SIGKILL what is left, its servers included. An agent leaves its daemon
    running at exit (mps.stop-on-exit off), so every test that starts one ends it here."""
    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.settings import Limits, MpsSettings

    settings = MpsSettings(
        pipe_dir=pipe_dir,
        log_dir=pipe_dir.parent / "log",
        ready_file=ready_file,
        control_binary=binary,
        command_timeout_seconds=2.0,
    )
    MpsDaemon(settings, Limits(0, {}, "")).stop(timeout_seconds=5)


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`script` run by bash (-euo pipefail) in `cwd`, as a user's shell runs it (process
    substitution included), with $NODEAGENT the command line of an emulated H200 whose state
    is `node.json` there; no NODEAGENT_* variable of the caller's."""
    found = shutil.which("bash")
    assert found is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["NODEAGENT"] = f"{sys.executable} -m nodeagent --simulate h200 --sim-state node.json"
    return subprocess.run([found, "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@contextlib.contextmanager
def emulated_mps_node(
    tmp_path: Path, binary: str, spec: str
) -> Iterator[tuple[list[str], list[str]]]:
    """The flags of an emulated node `spec` with its state in `tmp_path`, and of the fake MPS
    control daemon `binary` with its root there; a daemon still running after is told to quit."""
    from nodeagent.mps.control import MpsControl

    base = ["--simulate", spec, "--sim-state", str(tmp_path / "node.json")]
    try:
        yield base, ["--mps-control", binary, "--mps-root", str(tmp_path / "mps")]
    finally:
        control = MpsControl(binary, tmp_path / "mps" / "pipe", tmp_path / "mps" / "log")
        if control.daemon_pid() is not None:
            control.command("quit")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _clean_env(env: dict[str, str] | None) -> dict[str, str]:
    """The caller's environment without any NODEAGENT_* or MIG_PARTED_* variable, then `env`
    on top."""
    own = ("NODEAGENT_", "MIG_PARTED_")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    full_env.update(env or {})
    return full_env


@contextlib.contextmanager
def captured_logs(level: str) -> Iterator[list[dict[str, Any]]]:
    """The events logged at `level` and above while inside, with JSON logging configured as
    the agent does; the logging configuration before is restored after."""
    before = structlog.get_config()
    configure_logging(level, "json")
    try:
        with capture_logs() as events:
            yield events
    finally:
        structlog.configure(**before)


def in_process(main: Callable[[list[str]], int], tmp_path: Path) -> Callable[..., Result]:
    """A runner of the command line `main` in this process (see the `cli` fixture)."""

    def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        out, err = io.StringIO(), io.StringIO()
        sessions_before = set(session_registry)
        logging_before = structlog.get_config()
        cwd = os.getcwd()
        try:
            with (
                mock.patch.dict(os.environ, _clean_env(env), clear=True),
                mock.patch.object(sys, "stdin", io.StringIO(stdin or "")),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
            ):
                os.chdir(tmp_path)
                try:
                    returncode = main(list(args))
                except SystemExit as exc:
                    returncode = _exit_status(exc.code)
                except Exception:  # an uncaught error: a traceback and exit 1, as from a process
                    traceback.print_exc()
                    returncode = 1
        finally:
            os.chdir(cwd)
            structlog.configure(**logging_before)  # main() points the logs at `err`
            _shut_down_sessions_since(sessions_before)
        return Result(returncode, out.getvalue(), err.getvalue())

    return run


def _exit_status(code: object) -> int:
    """The status a process ends with on SystemExit(code), printing a message as it would."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _shut_down_sessions_since(before: set[int]) -> None:
    """What the end of a process does to the NVML sessions a command opened (atexit)."""
    for key in set(session_registry) - before:
        session = session_registry.pop(key)
        atexit.unregister(session.close)
        session.close()


def assert_one_error(res: Result, code: int, *words: str) -> None:
    """The command failed with `code` and one stderr sentence holding every word; no traceback."""
    assert res.returncode == code, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for word in words:
        assert word in lines[0], lines[0]
