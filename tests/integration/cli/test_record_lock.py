"""The ownership record's lock `.owners.json.lock` (issue 44 class 1): its path is checked with
the record's before the first NVML operation (a folder, a FIFO, a symbolic link: exit 2, one
sentence, the GPUs unchanged, where all NVML operations ran before), and it is taken within
the run's wait: held by another process, `mig apply --lock-timeout 1` says who holds it and
exits 3 (reason lock) instead of hanging. A write of the record cut short by a kill leaves a
temporary file: the next change sweeps it, under the lock."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nodeagent.state.owners import OWNERS_NAME
from tests.integration.cli.test_records_first import _apply, node  # noqa: F401 (a fixture)
from tests.integration.cli.test_stop_signals import _start
from tests.integration.test_sharing_convergence import CONFIGS
from tests.support.cli import Result, assert_one_error

LOCK = f".{OWNERS_NAME}.lock"


def _link(path: Path) -> None:
    path.with_name("elsewhere").write_text("")
    path.symlink_to(path.with_name("elsewhere"))


LOCK_PATHS: dict[str, tuple[Callable[[Path], None], str]] = {
    "folder": (lambda p: p.mkdir(), "is a folder"),
    "fifo": (lambda p: os.mkfifo(p), "is a named pipe (FIFO)"),
    "symlink": (_link, "is a symbolic link"),
    "dangling": (lambda p: p.symlink_to(p.with_name("gone")), "is a symbolic link"),
}


@contextmanager
def held(path: Path) -> Iterator[None]:
    """The record's lock held by this process (as another agent or command would)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", sorted(LOCK_PATHS))
def test_a_lock_path_that_is_no_file_refuses_before_any_nvml_call(
    node: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
    kind: str,
) -> None:
    make, words = LOCK_PATHS[kind]
    lock = tmp_path / LOCK
    make(lock)
    before = (tmp_path / "node.json").read_bytes()

    refused = _apply(node, tmp_path)

    assert_one_error(
        refused, 2, f"the ownership record's lock {lock} {words}", "nothing was changed"
    )
    assert refused.stdout == ""  # no operation was made
    assert (tmp_path / "node.json").read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens a file of mode 000")
def test_a_lock_of_mode_000_refuses_before_any_nvml_call(
    node: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
) -> None:
    lock = tmp_path / LOCK
    lock.write_text("")
    lock.chmod(0)
    before = (tmp_path / "node.json").read_bytes()
    refused = _apply(node, tmp_path)
    assert_one_error(refused, 2, "cannot open the ownership record's lock", "nothing was changed")
    assert (tmp_path / "node.json").read_bytes() == before


def test_a_held_lock_is_waited_for_within_the_lock_timeout_then_said_held(
    node: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
) -> None:
    before = (tmp_path / "node.json").read_bytes()
    configs = str(tmp_path / "configs.yaml")
    with held(tmp_path / LOCK):
        began = time.monotonic()
        refused = node("mig", "apply", "-f", configs, "-c", "all-1g.18gb", "--lock-timeout", "1")
        took = time.monotonic() - began
        as_json = node("mig", "apply", "-f", configs, "-c", "all-1g.18gb", "--lock-timeout",
                       "0", "-o", "json")  # fmt: skip
    assert_one_error(
        refused, 3, "another process holds the ownership record's lock", f"pid {os.getpid()}"
    )
    assert "gave up after 1 s" in refused.stderr
    assert took < 20, took
    assert json.loads(as_json.stdout)["reason"] == "lock"
    assert (tmp_path / "node.json").read_bytes() == before  # nothing changed
    done = node("mig", "apply", "-f", configs, "-c", "all-1g.18gb")  # let go: it goes through
    assert done.returncode == 0, done.stderr


def test_writes_of_the_record_cut_short_are_swept_at_the_next_change(
    node: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
) -> None:
    litter = [tmp_path / f".{OWNERS_NAME}.{n}" for n in ("k3x9_a0b", "zz0011aa")]
    for path in litter:
        path.write_text('{"version": 2, "clai')  # a write killed before its rename
    kept = tmp_path / f".{OWNERS_NAME}.notmine"  # not the name of a write: not ours

    kept.write_text("x")
    done = _apply(node, tmp_path)

    assert done.returncode == 0, done.stderr
    assert not any(p.exists() for p in litter)
    assert kept.read_text() == "x" and (tmp_path / LOCK).exists()
    assert '"config": "all-1g.18gb"' in (tmp_path / OWNERS_NAME).read_text()


def test_a_stop_while_waiting_for_the_record_ends_the_wait_at_once(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    base = ["--simulate", "h200", "--sim-state", str(state)]
    configs = tmp_path / "configs.yaml"
    configs.write_text(
        subprocess.run([sys.executable, "-m", "nodeagent", *base, "mig", "generate-config"],
                       capture_output=True, text=True, check=True).stdout
    )  # fmt: skip
    logs = ["--log-level", "info", "--log-format", "json"]
    apply = [*base, *logs, "mig", "apply", "-f", str(configs), "-c", "all-1g.18gb",
             "--lock-timeout", "60"]  # fmt: skip
    with held(tmp_path / LOCK):
        proc = _start(apply)
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        deadline, seen = time.monotonic() + 30, b""
        while b'"lock.waiting"' not in seen:
            assert proc.poll() is None and time.monotonic() < deadline, seen
            try:
                seen += os.read(proc.stderr.fileno(), 1 << 16)
            except BlockingIOError:
                time.sleep(0.05)
        os.set_blocking(proc.stderr.fileno(), True)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        took = time.monotonic() - began
    assert proc.returncode == 143, err
    assert took < 10, took
    assert err.splitlines()[-1] == (
        f"nodeagent: stopped by SIGTERM while waiting for the ownership record's lock"
        f" {tmp_path / LOCK}; nothing was changed"
    )
    status = subprocess.run([sys.executable, "-m", "nodeagent", *base, "status", "-o", "json"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert [(g["mig_current"], g["slices"]) for g in json.loads(status.stdout)["gpus"]] == [
        (False, [])
    ]


def test_sharing_apply_checks_the_lock_path_before_any_nvml_call(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str
) -> None:
    (tmp_path / "sharing.yaml").write_text(CONFIGS)
    state = tmp_path / "node.json"
    base = ["--simulate", "h200x8", "--sim-state", str(state)]
    mps = ["--mps-control", fake_mps_control, "--mps-root", str(tmp_path / "mps")]
    assert cli(*base, "status").returncode == 0  # the emulator's state written
    (tmp_path / LOCK).mkdir()
    before = state.read_bytes()

    refused = cli(*base, "sharing", "apply", "-f", str(tmp_path / "sharing.yaml"), *mps,
                  "-c", "mixed")  # fmt: skip

    assert_one_error(
        refused, 2, f"the ownership record's lock {tmp_path / LOCK} is a folder", "nothing was"
    )
    assert state.read_bytes() == before


def test_the_writer_lock_and_the_record_lock_share_one_lock_timeout(
    node: Callable[..., Result],  # noqa: F811
    tmp_path: Path,
) -> None:
    # the MIG writer lock held for 7 s, the record's lock longer: --lock-timeout 8 is one wait
    # for both (before: 7 s + a full 8 s more), and the sentence says the seconds waited. The
    # time runs from the spawn: nodeagent's start (S) comes first, so it exits at S + 8 s
    # (before: 15 s); a loaded machine's start took 3.7 s once, and S up to 5.5 s passes
    writer = tmp_path / ".node.json.lock"
    configs = str(tmp_path / "configs.yaml")
    args = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json"), "mig", "apply"]
    with held(tmp_path / LOCK):
        with held(writer):
            proc = _start([*args, "-f", configs, "-c", "all-1g.18gb", "--lock-timeout", "8"])
            began = time.monotonic()  # nodeagent is starting
            time.sleep(7)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - began
    assert proc.returncode == 3, err
    assert "another process holds the ownership record's lock" in err
    assert "gave up after 8 s" in err, err
    assert took < 13.5, took  # one 8 s wait, not 7 s and then 8 s more (15 s)
