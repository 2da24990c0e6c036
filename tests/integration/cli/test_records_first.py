"""Every record a change needs is read and checked before its first NVML call (issue 39 class
9): with the ownership record unwritable (a folder, a FIFO, a socket, a symbolic link, a loop
of links, a dangling link), `mig apply` exits 2 with one sentence and the emulated GPUs are
unchanged, as exit 2 promises; a record, a DRA checkpoint or a CDI spec that is no JSON record
(100,000 nested arrays, a list, devices as a string, bytes that are not UTF-8) is answered in
our words, never with RecursionError or Python's text."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.checkpoint import load
from nodeagent.settings.groups import DEFAULT_DRA_DRIVER
from nodeagent.state.owners import OWNERS_NAME
from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]
NESTED = b"[" * 100_000 + b"]" * 100_000


def _socket(path: Path) -> None:
    # bound by its name relative to its folder: a socket's path is limited to 108 bytes
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(cwd)


def _link_to_a_record(path: Path) -> None:
    real = path.with_name("real.json")
    real.write_text('{"version": 1, "claims": {}, "config": null}')
    path.symlink_to(real)


UNWRITABLE: dict[str, tuple[Callable[[Path], None], str]] = {
    "folder": (lambda p: p.mkdir(), "is a folder"),
    "fifo": (lambda p: os.mkfifo(p), "is a named pipe (FIFO)"),
    "socket": (_socket, "is a socket"),
    "symlink": (_link_to_a_record, "is a symbolic link"),
    "loop": (lambda p: p.symlink_to(p), "is a symbolic link"),
    "dangling": (lambda p: p.symlink_to(p.with_name("gone.json")), "is a symbolic link"),
}


@pytest.fixture
def node(tmp_path: Path, cli: Cli) -> Callable[..., Result]:
    """`nodeagent --simulate h200` with its state (and so its ownership record) in tmp_path;
    the generated MIG configs at tmp_path/configs.yaml."""
    state = tmp_path / "node.json"

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return cli("--simulate", "h200", "--sim-state", str(state), *args, env=env)

    made = run("mig", "generate-config")
    assert made.returncode == 0, made.stderr
    (tmp_path / "configs.yaml").write_text(made.stdout)
    return run


def _apply(
    node: Callable[..., Result], tmp_path: Path, env: dict[str, str] | None = None
) -> Result:
    return node("mig", "apply", "-f", str(tmp_path / "configs.yaml"), "-c", "all-1g.18gb", env=env)


@pytest.mark.parametrize("kind", sorted(UNWRITABLE))
def test_an_unwritable_ownership_record_refuses_before_any_nvml_call(
    node: Callable[..., Result], tmp_path: Path, kind: str
) -> None:
    make, words = UNWRITABLE[kind]
    record = tmp_path / OWNERS_NAME
    make(record)
    before = (tmp_path / "node.json").read_bytes()

    refused = _apply(node, tmp_path)

    assert_one_error(refused, 2, f"the ownership record {record} {words}", "nothing was changed")
    assert refused.stdout == ""  # no operation was made, so none was reported
    assert (tmp_path / "node.json").read_bytes() == before


def test_a_record_of_100000_nested_arrays_is_rebuilt_and_replaced(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / OWNERS_NAME).write_bytes(NESTED)

    done = _apply(node, tmp_path)

    assert done.returncode == 0, done.stderr
    assert "RecursionError" not in done.stderr and "Traceback" not in done.stderr
    assert '"config": "all-1g.18gb"' in (tmp_path / OWNERS_NAME).read_text()


def _cdi_spec(tmp_path: Path, data: bytes) -> dict[str, str]:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / f"k8s.{DEFAULT_DRA_DRIVER}-claim_uid-1.json").write_bytes(data)
    return {"NODEAGENT_DRA_CDI_DIR": str(cdi)}


def _checkpoint(tmp_path: Path, data: bytes) -> dict[str, str]:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "checkpoint.json").write_bytes(data)
    return {"NODEAGENT_DRA_PLUGIN_DIR": str(plugin)}


@pytest.mark.parametrize(
    ("trace", "data", "words"),
    [
        (_cdi_spec, NESTED, "is unreadable (it is not JSON: it is nested too deeply)"),
        (_cdi_spec, b"[1, 2]", "is unreadable (it is a list, not an object)"),
        (_cdi_spec, b'{"devices": "gpu-0"}', "(its devices is a string, not a list)"),
        (_cdi_spec, b'{"devices": [7]}', "(its devices[0] is a number, not an object)"),
        (_cdi_spec, b"\xff\xfe{}", "(it is not UTF-8 text (bad byte at offset 0))"),
        (_checkpoint, NESTED, "checkpoint.json is not JSON: it is nested too deeply"),
        (_checkpoint, b"\xff{}", "checkpoint.json is not UTF-8 text (bad byte at offset 0)"),
        (_checkpoint, b'{"version": true, "claims": {}}', "is not a version 2 checkpoint"),
    ],
    ids=[
        "cdi-nested", "cdi-list", "cdi-devices-string", "cdi-device-number", "cdi-not-utf8",
        "checkpoint-nested", "checkpoint-not-utf8", "checkpoint-version-true",
    ],
)  # fmt: skip
def test_a_trace_that_is_no_record_refuses_in_our_words(
    node: Callable[..., Result],
    tmp_path: Path,
    trace: Callable[[Path, bytes], dict[str, str]],
    data: bytes,
    words: str,
) -> None:
    env = trace(tmp_path, data)
    before = (tmp_path / "node.json").read_bytes()

    refused = _apply(node, tmp_path, env)

    assert refused.returncode == 3, refused.stderr
    assert "Traceback" not in refused.stderr and "RecursionError" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]  # after the rebuild's warning log line
    assert "in use by an unknown owner" in last and words in last, last
    assert "nothing was changed" in last
    assert (tmp_path / "node.json").read_bytes() == before


def test_readyz_reads_a_nested_checkpoint_as_one_sentence(tmp_path: Path) -> None:
    # NodeDriver.problem (/readyz) is this load's sentence
    path = tmp_path / "checkpoint.json"
    path.write_bytes(NESTED)
    with pytest.raises(ConfigError, match="is not JSON: it is nested too deeply"):
        load(path)
