"""Paths a user names are written only as regular files; pid files are trusted only when they
name the MPS control daemon; a full disk under the MIG writer lock is the system refusing.

Every refusal: its documented exit code, one sentence naming the path, nothing changed (the
emulated node's state, the thing at the path, the process a stale pid file names)."""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import (
    atomic_write_text,
    open_lock_file,
    read_regular,
    remove_regular,
    write_if_changed,
)
from nodeagent.base.lock import lock_path, mig_writer_lock
from nodeagent.labels.nfd import write_features
from tests.support.cli import Result, assert_one_error

KINDS = ("symlink", "dangling-symlink", "fifo", "folder", "char-device", "socket")
WORDS = {
    "symlink": "a symbolic link",
    "dangling-symlink": "a symbolic link",
    "fifo": "a named pipe (FIFO)",
    "folder": "a folder",
    "char-device": "a character device",
    "socket": "a socket",
}


def make_kind(path: Path, kind: str) -> Callable[[], object]:
    """Put a `kind` at `path`; returns what it is now (compared after a refusal)."""
    victim = path.with_name(path.name + ".victim")
    if kind == "symlink":
        victim.write_text("keep me\n")
        path.symlink_to(victim)
    elif kind == "dangling-symlink":
        path.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("keep me\n")
    elif kind == "char-device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()

    def now() -> object:
        st = os.lstat(path)
        text = victim.read_text() if victim.exists() else None
        inside = sorted(p.name for p in path.iterdir()) if stat.S_ISDIR(st.st_mode) else None
        return (stat.S_IFMT(st.st_mode), st.st_ino, text, inside)

    return now


# -- files.py, table-driven over the kinds of thing a path can name -------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "write",
    [
        lambda p: atomic_write_text(p, "x\n", what="the test file"),
        lambda p: write_if_changed(p, "x\n", "the test file"),
        lambda p: remove_regular(p, "the test file"),
        lambda p: os.close(open_lock_file(p, "the test file")),
    ],
    ids=["atomic_write", "write_if_changed", "remove", "lock"],
)
def test_a_non_regular_target_is_refused_and_left_as_it_was(
    tmp_path: Path, kind: str, write: Callable[[Path], object]
) -> None:
    target = tmp_path / "target"
    now = make_kind(target, kind)
    before = now()
    with pytest.raises(ConfigError) as err:
        write(target)
    assert str(err.value) == (
        f"the test file {target} is {WORDS[kind]}, not a regular file; remove it or name another"
    )
    assert now() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".target")) == []


@pytest.mark.parametrize("kind", [k for k in KINDS if "symlink" not in k])
def test_a_read_refuses_what_is_not_a_regular_file_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "target"
    now = make_kind(target, kind)
    before = now()
    link = tmp_path / "link"
    link.symlink_to(target)
    for path in (target, link):  # a link is followed, to a regular file only
        read_words = {"a folder": "a directory", "a named pipe (FIFO)": "a FIFO"}
        word = read_words.get(WORDS[kind], WORDS[kind])
        with pytest.raises(ConfigError, match=f"it is {re.escape(word)}, not a file"):
            read_regular(path, "the test file", 100)
    assert now() == before


def test_a_read_follows_a_link_to_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x" * 1000)
    (tmp_path / "link").symlink_to(tmp_path / "data")
    assert read_regular(tmp_path / "link", "f", 1000) == b"x" * 1000
    with pytest.raises(ConfigError, match=r"cannot read f .*link: it is larger than 10 bytes"):
        read_regular(tmp_path / "link", "f", 10)  # bounded: refused, never cut short
    assert read_regular(tmp_path / "dangling", "f", 10) is None


def test_a_regular_file_is_replaced_and_an_absent_one_made(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "target"
    assert write_if_changed(target, "a\n", "f") is True
    assert write_if_changed(target, "a\n", "f") is False
    assert write_if_changed(target, "b\n", "f") is True
    assert read_regular(target, "f", 100) == b"b\n"
    remove_regular(target, "f")
    remove_regular(target, "f")  # absent: nothing to do
    assert not target.exists() and read_regular(target, "f", 100) is None


def test_the_nfd_features_file_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "features"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"NFD features file .* is a named pipe"):
        write_features(fifo, {"a": "b"})


# -- the MIG writer lock, through `mig apply` ------------------------------------------------


@pytest.fixture
def node(tmp_path: Path, cli: Callable[..., Result]) -> Iterator[tuple[list[str], Path, Path]]:
    state = tmp_path / "node.json"
    base = ["--simulate", "h200", "--sim-state", str(state)]
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*base, "mig", "generate-config").stdout)
    assert cli(*base, "status").returncode == 0
    lock = lock_path(Path("/unused"), state, simulate=True)
    assert lock is not None
    yield base, mig, lock


@pytest.mark.parametrize("kind", KINDS)
def test_mig_apply_refuses_a_lock_path_that_is_not_a_regular_file(
    cli: Callable[..., Result], node: tuple[list[str], Path, Path], kind: str
) -> None:
    base, mig, lock = node
    now = make_kind(lock, kind)
    before, state = now(), Path(base[3]).read_bytes()
    res = cli(*base, "mig", "apply", "-f", str(mig), "-c", "all-balanced")
    assert_one_error(res, 2, "MIG writer lock", str(lock), WORDS[kind])
    assert now() == before
    assert Path(base[3]).read_bytes() == state


def test_a_full_disk_while_writing_the_lock_pid_is_exit_3_naming_the_lock(
    cli: Callable[..., Result],
    node: tuple[list[str], Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base, mig, lock = node
    state = Path(base[3]).read_bytes()
    real_pwrite = os.pwrite

    def full_disk(fd: int, data: bytes, offset: int) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(lock):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_disk)
    res = cli(*base, "mig", "apply", "-f", str(mig), "-c", "all-balanced")
    assert_one_error(res, 3, str(lock), "No space left on device")
    assert Path(base[3]).read_bytes() == state
    monkeypatch.undo()
    with mig_writer_lock(lock, 0):  # released: the next writer takes it at once
        pass


def test_a_pid_write_the_kernel_refuses_is_exit_3(tmp_path: Path) -> None:
    """RLIMIT_FSIZE 0 in a child: the kernel refuses the pid write with EFBIG as a full disk
    refuses it with ENOSPC; the sentence names the lock and the OS error."""
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from nodeagent.base.lock import mig_writer_lock\n"
        "from nodeagent.base.errors import AgentError\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
        "try:\n"
        f"    with mig_writer_lock(Path({str(tmp_path / 'l')!r}), 0):\n"
        "        pass\n"
        "except AgentError as err:\n"
        "    print(err.exit_code, err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    want = f"3 cannot write this process's pid into the MIG writer lock {tmp_path / 'l'}:"
    assert out.stdout.startswith(want), out
    assert "File too large" in out.stdout


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [(errno.ENOSPC, 3), (errno.EROFS, 3), (errno.EDQUOT, 3), (errno.EACCES, 2)],
)
def test_the_nfd_features_file_on_a_full_disk_is_the_system_refusing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, exit_code: int
) -> None:
    features = tmp_path / "features"
    write_features(features, {"a": "old"})

    def refused(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(AgentError) as err:
        write_features(features, {"a": "new"})
    assert err.value.exit_code == exit_code
    assert str(err.value) == f"cannot write NFD features file {features}: {os.strerror(code)}"
    assert features.read_text() == "a=old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features"]  # no temporary left
