"""Shared test helpers: emulated GPUs, NVML sessions over them, and the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip("../shared/fixtures is not beside this checkout")
    return SHARED_FIXTURES


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


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., Result]:
    """Run `nodeagent ARGS` in a subprocess, as a user would; returns code and output."""

    def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "nodeagent", *args],
            capture_output=True,
            text=True,
            env=full_env,
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
