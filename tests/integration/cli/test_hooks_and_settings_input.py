"""The hooks file and the settings file as a user hands them: from a pipe (`<(cat file)`, a
named FIFO; read once, bounded), and a hooks file whose aliases repeat a long string (a YAML
bomb for the kernel's command line) refused as bad input before anything changes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.base.errors import ConfigError
from nodeagent.cli.commands import build_parser
from nodeagent.cli.common import Context
from tests.support.cli import Result, assert_one_error, bash

HOOKS = {"version": "v1", "hooks": {"apply-start": [{"command": "/bin/sh", "args": ["-c", "echo ran > ran"]}]}}  # fmt: skip
SETTINGS = "version: nodeagent/v1\nmig:\n  lock-timeout: 7\nmetrics:\n  refresh-interval: 3\n"


def test_hooks_and_settings_from_process_substitution(tmp_path: Path) -> None:
    (tmp_path / "hooks.yaml").write_text(yaml.safe_dump(HOOKS))
    (tmp_path / "settings.yaml").write_text(SETTINGS)
    proc = bash(
        "$NODEAGENT mig apply -c all-1g.18gb -k <(cat hooks.yaml)\n"
        "$NODEAGENT config check --config <(cat settings.yaml) -o json\n",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ran").read_text() == "ran\n"
    assert '"lock-timeout": 7.0' in proc.stdout and '"refresh-interval": 3.0' in proc.stdout
    assert '"mig.lock-timeout": "file /dev/fd/' in proc.stdout


@contextlib.contextmanager
def _fifo(tmp_path: Path, text: str) -> Iterator[Path]:
    """A named FIFO holding `text` from a writer that is done (it wrote and closed): the text
    waits in the pipe while a reader of ours keeps it open, then reads with its end."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    keep = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        writer = os.open(path, os.O_WRONLY)
        os.write(writer, text.encode())
        os.close(writer)
        yield path
    finally:
        os.close(keep)


def test_settings_from_a_named_fifo(tmp_path: Path, cli: Callable[..., Result]) -> None:
    with _fifo(tmp_path, SETTINGS) as path:
        res = cli("config", "check", "--config", str(path))
    assert res.returncode == 0, res.stderr
    assert "lock-timeout: 7.0" in res.stdout


def test_a_reload_of_settings_from_a_pipe_keeps_them(tmp_path: Path) -> None:
    """`run`'s SIGHUP reads the settings again: a pipe then gives nothing (or another
    writer's text), so the reload is refused with a sentence and the settings stay."""
    with _fifo(tmp_path, SETTINGS) as path:
        args = build_parser().parse_args(["config", "check", "--config", str(path)])
        ctx = Context(args, {})
        assert ctx.load_settings().mig.lock_timeout_seconds == 7.0
        with pytest.raises(ConfigError, match="is a pipe, read once when the agent started"):
            ctx.load_settings()
    assert ctx.settings.mig.lock_timeout_seconds == 7.0


def test_a_hooks_file_of_aliases_of_a_long_string_is_bad_input(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    long = "x" * 100_000
    args = f'[&s "{long}", ' + ", ".join(["*s"] * 2000) + "]"
    (tmp_path / "bomb.yaml").write_text(
        f"version: v1\nhooks:\n  apply-start:\n    - command: /bin/true\n      args: {args}\n"
    )
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    res = cli(*base, "mig", "apply", "-c", "all-1g.18gb", "-k", str(tmp_path / "bomb.yaml"))
    assert_one_error(res, 2, "bomb.yaml:4:7: apply-start[0]", "more than 131,072 bytes")
    assert len(res.stderr) < 500
    assert cli(*base, "mig", "assert", "-c", "all-disabled").returncode == 0  # nothing changed
