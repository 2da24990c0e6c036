"""Shared test helpers: emulated GPUs, NVML sessions over them, and the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support import k8s as support_k8s
from tests.support import leaks
from tests.support.agent import Agents
from tests.support.cli import REPO, SHARED_FIXTURES, Result, _clean_env, c_string, in_process
from tests.support.fake_mps.script import control_script

_SUBREAPER = pytest.StashKey[bool]()


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
    """tests/support/fake_mps/nvidia-cuda-mps-control, started by this interpreter without site-packages;
    where a C compiler is, its client side is tests/support/fake_mps/control_client.c.

    MPS tests run the control program for every command (hundreds of times); through
    `/usr/bin/env python3` (a pyenv shim, a site-packages scan) each run took ~0.15 s, with
    `python -I -S` ~0.04 s, importing only _socket ~0.011 s, compiled ~0.001 s. The fake uses
    the standard library only.
    """
    folder = tmp_path_factory.mktemp("fake_mps")
    # the daemon runs as `python -IS .../daemon/nvidia-cuda-mps-control -d`
    script = control_script(folder / "daemon")
    binary = folder / "nvidia-cuda-mps-control"
    try:
        built = subprocess.run(
            ["cc", "-O1", f"-DFAKE_PYTHON={c_string(sys.executable)}",
             f"-DFAKE_SCRIPT={c_string(str(script))}", "-o", str(binary),
             str(REPO / "tests" / "support" / "fake_mps" / "control_client.c")],
            capture_output=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return str(script)
    return str(binary) if built.returncode == 0 else str(script)


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


@pytest.fixture
def agents() -> Iterator[Agents]:
    """Start agents with `agents.start(session, reset, **groups)`; all stop after the test."""
    started = Agents()
    yield started
    started.stop_all()
