"""Every file reader against files that are no config: a FIFO, /dev/zero, a 100 MiB sparse file,
a directory, a dangling symlink, an unreadable file. Each reader (MIG config, sharing config,
settings file, hooks file, workload file, device plugin config, machine-type file) answers with
one sentence naming the file and exit 2, at once (no hang on the FIFO, no MemoryError), and the
emulated GPUs are unchanged. The machine-type file alone reads as `unknown` whatever is wrong
with it, as GFD's does (a VM without DMI is common), with a warning where it is no file: a
label publish never fails on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.configfile import MAX_FILE_BYTES
from tests.integration.test_hostile_inputs import GOOD_MIG
from tests.support.cli import Result, assert_one_error

SIM = ("--simulate", "h200", "--sim-state", "{tmp}/node.json")

# reader -> (argv with {file} for the hostile path, the words its sentence names)
READERS: dict[str, tuple[tuple[str, ...], str]] = {
    "mig-config": ((*SIM, "mig", "apply", "-f", "{file}", "-c", "all-balanced"), "MIG config file"),
    "sharing-config": (
        (*SIM, "sharing", "apply", "-f", "{file}", "-c", "x"),
        "sharing config file",
    ),
    "settings-file": (("config", "check", "--config", "{file}"), "settings file"),
    "hooks-file": (
        (
            *SIM,
            "mig",
            "apply",
            "-f",
            "{tmp}/mig.yaml",
            "-c",
            "all-balanced",
            "--hooks-file",
            "{file}",
        ),
        "hooks file",
    ),
    "workload-file": ((*SIM, "plan", "-f", "{file}"), "workload file"),
    "device-plugin-config": (
        (
            *SIM,
            "mps",
            "status",
            "--mps-control",
            "/nonexistent/mps",
            "--mps-device-plugin-config",
            "{file}",
        ),
        "device plugin config",
    ),
    "machine-type-file": ((*SIM, "labels", "--machine-type-file", "{file}"), "machine-type file"),
}


# the readers that take a pipe too (`-f <(generate)`: tests/integration/cli/test_pipe_inputs.py,
# test_hooks_and_settings_input.py), and what they say of an empty one
PIPE_READERS = {
    "mig-config": "the file is empty",
    "sharing-config": "the file is empty",
    "workload-file": "the file is empty",
    "hooks-file": "the file is empty",
    "settings-file": "must be a mapping with version",
}


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def _sparse(tmp: Path) -> str:
    with open(tmp / "sparse.yaml", "wb") as f:
        f.truncate(100 * 1024 * 1024)
    return str(tmp / "sparse.yaml")


def _directory(tmp: Path) -> str:
    (tmp / "adir").mkdir()
    return str(tmp / "adir")


def _dangling(tmp: Path) -> str:
    (tmp / "link.yaml").symlink_to(tmp / "gone.yaml")
    return str(tmp / "link.yaml")


def _unreadable(tmp: Path) -> str:
    if os.geteuid() == 0:
        # root reads a mode-000 file; /proc/self/mem at offset 0 fails to read for everyone.
        return "/proc/self/mem"
    path = tmp / "secret.yaml"
    path.write_text(GOOD_MIG)
    path.chmod(0)
    return str(path)


# hostile file -> (how to make it, the words of the sentence, whether it is only "unreadable")
HOSTILE: dict[str, tuple[Callable[[Path], str], str, bool]] = {
    "fifo": (_fifo, "is a FIFO", False),
    "dev-zero": (lambda _tmp: "/dev/zero", "is a character device", False),
    "sparse-100mib": (_sparse, f"larger than {MAX_FILE_BYTES // 2**20} MiB", False),
    "directory": (_directory, "is a directory", False),
    "dangling-symlink": (_dangling, "No such file", True),
    "unreadable": (_unreadable, "cannot read", True),
}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_hostile_file(
    cli: Callable[..., Result], tmp_path: Path, reader: str, hostile: str
) -> None:
    (tmp_path / "mig.yaml").write_text(GOOD_MIG)
    assert cli(*[a.format(tmp=tmp_path) for a in SIM], "mig", "export").returncode == 0
    before = (tmp_path / "node.json").read_bytes()
    make, words, _only_unreadable = HOSTILE[hostile]
    path = make(tmp_path)
    argv, what = READERS[reader]
    res = cli(*[a.format(tmp=tmp_path, file=path) for a in argv])
    # `labels --machine-type-file` given a file it cannot read is refused like every input
    # (issue 39 class 4: a FIFO or a folder was taken as `unknown`); an absent one reads
    # `unknown`, as in GPU Feature Discovery (so does a dangling link, and a file root reads)
    if reader == "machine-type-file" and hostile in ("dangling-symlink", "unreadable"):
        assert res.returncode == 0, res.stderr
        assert "nvidia.com/gpu.machine=unknown" in res.stdout.splitlines()
    elif reader in PIPE_READERS and hostile == "fifo":
        # a pipe (`-f <(generate)`): one nobody writes reads as empty, at once
        assert_one_error(res, 2, path, PIPE_READERS[reader])
    else:
        assert_one_error(res, 2, what, path, words)
    assert (tmp_path / "node.json").read_bytes() == before
