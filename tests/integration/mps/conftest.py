"""A fake `chcon` for the MPS tests: upstream labels the pipe directory for containers where
SELinux is enabled (nodeagent.mps.layout.label_for_containers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAILURE = "chcon: failed to change context of 'x' to 'y': Operation not supported"


@pytest.fixture
def chcon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Path]]:
    """Put a fake `chcon` first on PATH; returns the file its calls are recorded in."""

    def install(fail: bool = False) -> Path:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        calls = tmp_path / "chcon.calls"
        body = f'echo "{FAILURE}" >&2; exit 1' if fail else 'echo "$@" >> "$CALLS"'
        script = bin_dir / "chcon"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CALLS", str(calls))
        return calls

    yield install
