"""Shared test helpers: emulated GPUs, NVML sessions over them, and the CLI as a user runs it."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import structlog
from structlog.testing import capture_logs

from nodeagent.base.logs import configure_logging
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.session import _sessions as session_registry
from nodeagent.sim import SimulatedNvml, parse_spec
from tests import leaks, support_k8s

_SUBREAPER = pytest.StashKey[bool]()

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


# -- no process outlives the suite (tests/leaks.py) ---------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """The session's process (xdist's controller, or pytest alone) marks the environment every
    test process inherits and becomes the subreaper of whatever they start."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller does this
        return
    os.environ.setdefault(leaks.MARKER, uuid.uuid4().hex)
    config.stash[_SUBREAPER] = leaks.become_subreaper()  # else only the marker finds them


@pytest.hookimpl(trylast=True)  # after session fixtures are torn down and workers have ended
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return
    support_k8s.stop_shared(os.environ[leaks.MARKER])  # the real control plane, if it ran
    grace = float(os.environ.get(leaks.GRACE, "5"))
    found = leaks.wait_for_leaks(os.getpid(), os.environ[leaks.MARKER], grace)
    if not found:
        return
    leaks.end(found)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(found)} processes started by the tests were still running at the end:"]
    lines += [f"  pid {pid}: {command}" for pid, command in found.items()]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip("../shared/fixtures is not beside this checkout")
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def fake_mps_control(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/fake_mps/nvidia-cuda-mps-control, started by this interpreter without site-packages;
    where a C compiler is, its client side is tests/fake_mps/control_client.c.

    MPS tests run the control program for every command (hundreds of times); through
    `/usr/bin/env python3` (a pyenv shim, a site-packages scan) each run took ~0.15 s, with
    `python -I -S` ~0.04 s, importing only _socket ~0.011 s, compiled ~0.001 s. The fake uses
    the standard library only.
    """
    text = (REPO / "tests" / "fake_mps" / "nvidia-cuda-mps-control").read_text()
    _, body = text.split("\n", 1)
    folder = tmp_path_factory.mktemp("fake_mps")
    (folder / "daemon").mkdir()  # the daemon runs as `python -IS .../nvidia-cuda-mps-control -d`
    script = folder / "daemon" / "nvidia-cuda-mps-control"
    script.write_text(f"#!{sys.executable} -IS\n{body}")
    script.chmod(0o755)
    binary = folder / "nvidia-cuda-mps-control"
    try:
        built = subprocess.run(
            ["cc", "-O1", f"-DFAKE_PYTHON={c_string(sys.executable)}",
             f"-DFAKE_SCRIPT={c_string(str(script))}", "-o", str(binary),
             str(REPO / "tests" / "fake_mps" / "control_client.c")],
            capture_output=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return str(script)
    return str(binary) if built.returncode == 0 else str(script)


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


@pytest.fixture
def make_emulator() -> Callable[..., SimulatedNvml]:
    def make(spec: str = "h200", state: Path | None = None) -> SimulatedNvml:
        return SimulatedNvml(parse_spec(spec), state)

    return make


@pytest.fixture
def make_session(make_emulator: Callable[..., SimulatedNvml]) -> Callable[..., NvmlSession]:
    """A fresh NvmlSession per emulator (tests need many independent nodes in one process)."""

    def make(spec: str = "h200", state: Path | None = None) -> NvmlSession:
        return NvmlSession(make_emulator(spec, state))

    return make


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


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., Result]:
    """Run `nodeagent ARGS` as a user would, but in this process; returns code and output.

    The call gets what a fresh process would: `env` as the whole NODEAGENT_* environment,
    `stdin` as its standard input, tmp_path as its working directory, its own stdout and stderr
    (logs included), and the NVML sessions it opened shut down when it returns. Commands that
    must end the interpreter (fault rules with "exit"), take signals or run until stopped
    belong to `cli_process`.
    """

    from nodeagent.cli import main  # here, so a broken CLI fails only the tests that run it

    return in_process(main, tmp_path)


@pytest.fixture
def mig_parted(tmp_path: Path) -> Callable[..., Result]:
    """Run `nvidia-mig-parted ARGS` (nodeagent's mig-parted command line) as `cli` runs
    `nodeagent ARGS`: in this process, as a fresh process would see it."""
    from nodeagent.cli.migparted import main

    return in_process(main, tmp_path)


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


@pytest.fixture
def cli_process(tmp_path: Path) -> Callable[..., Result]:
    """Run `nodeagent ARGS` in a subprocess, for what only a process shows (exit, signals)."""

    def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "nodeagent", *args],
            capture_output=True,
            text=True,
            env=_clean_env(env),
            input=stdin,
            timeout=60,
            cwd=tmp_path,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


def assert_one_error(res: Result, code: int, *words: str) -> None:
    """The command failed with `code` and one stderr sentence holding every word; no traceback."""
    assert res.returncode == code, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for word in words:
        assert word in lines[0], lines[0]
