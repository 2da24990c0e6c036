"""`nodeagent mps` against what a node can hold by accident or by malice: a stale pid file naming
another process (its pid was reused), ready files that are links, device nodes, FIFOs or folders.
The daemon is the fake nvidia-cuda-mps-control (tests/support/fake_mps), every one stopped after."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.mps.control import PID_FILE
from nodeagent.mps.layout import paths, prepare
from tests.integration.test_hostile_paths import KINDS, WORDS, make_kind
from tests.support.cli import Result, assert_one_error


@pytest.fixture
def mps(
    tmp_path: Path, cli: Callable[..., Result], fake_mps_control: str
) -> Iterator[Callable[..., Result]]:
    """`nodeagent --simulate h200 mps ACTION` on the fake control daemon in tmp_path."""
    flags = [
        "--mps-control", fake_mps_control,
        "--mps-pipe-dir", str(tmp_path / "pipe"),
        "--mps-log-dir", str(tmp_path / "log"),
        "--mps-replicas", "2",
    ]  # fmt: skip

    def run(action: str, *extra: str) -> Result:
        return cli("--simulate", "h200", "mps", action, *flags, *extra)

    yield run
    pid_file = tmp_path / "pipe" / PID_FILE
    if pid_file.is_file() and not pid_file.is_symlink():
        run("stop")


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `sleep` whose pid a stale daemon pid file names (the daemon died, its pid reused)."""
    proc = subprocess.Popen(["sleep", "600"])
    pid_file = tmp_path / "pipe" / PID_FILE
    pid_file.parent.mkdir()
    pid_file.write_text(f"{proc.pid}\n")
    yield proc
    proc.kill()
    proc.wait()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_stop_leaves_the_process_a_stale_pid_file_names_alone(
    tmp_path: Path, mps: Callable[..., Result], sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "pipe" / PID_FILE
    res = mps("stop")
    assert res.returncode == 1, res
    assert "no MPS control daemon runs" in res.stderr and "nothing to stop" in res.stderr
    assert "mps.stale_pid_file" in res.stderr and str(sleeper.pid) in res.stderr
    assert _alive(sleeper)
    assert not pid_file.exists()  # stale: removed


def test_start_replaces_a_stale_pid_file_instead_of_adopting_its_process(
    tmp_path: Path, mps: Callable[..., Result], sleeper: subprocess.Popen[bytes]
) -> None:
    pid_file = tmp_path / "pipe" / PID_FILE
    res = mps("start")
    assert res.returncode == 0, res
    daemon = int(pid_file.read_text())
    assert daemon != sleeper.pid and f"running, pid {daemon}" in res.stdout
    res = mps("stop")
    assert res.returncode == 0 and f"stopped (pid {daemon})" in res.stdout, res
    assert _alive(sleeper)


def test_stop_ends_the_real_daemon_it_names(tmp_path: Path, mps: Callable[..., Result]) -> None:
    assert mps("start").returncode == 0
    daemon = int((tmp_path / "pipe" / PID_FILE).read_text())
    res = mps("stop")
    assert res.returncode == 0 and f"pid {daemon}" in res.stdout, res
    assert not Path(f"/proc/{daemon}").exists() or "Z" in Path(f"/proc/{daemon}/stat").read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_start_refuses_a_ready_file_that_is_not_a_regular_file(
    tmp_path: Path, mps: Callable[..., Result], kind: str
) -> None:
    ready = tmp_path / "ready"
    now = make_kind(ready, kind)
    before = now()
    res = mps("start", "--mps-ready-file", str(ready))
    assert_one_error(res, 2, "MPS ready file", str(ready), WORDS[kind])
    assert now() == before
    assert not (tmp_path / "pipe" / PID_FILE).exists()  # no daemon was started
    assert mps("stop", "--mps-ready-file", str(ready)).returncode == 2  # nor removed by stop


def test_a_pid_file_that_is_a_fifo_is_refused_without_blocking(
    tmp_path: Path, mps: Callable[..., Result]
) -> None:
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / PID_FILE)
    assert_one_error(mps("status"), 2, "pid file", "it is a FIFO, not a file")


@pytest.mark.parametrize("link", ["root", "pipe", "log"])
def test_layout_folders_are_never_opened_to_clients_through_a_link(
    tmp_path: Path, link: str
) -> None:
    """The device plugin layout makes its folders 0755 for non-root clients: a link there
    (to /root, say) is refused, and the folder it names keeps its mode."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    root = tmp_path / "mps"
    where = paths("device-plugin", root)
    target = {"root": root, "pipe": where.pipe_dir, "log": where.log_dir}[link]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(private)
    with pytest.raises(ConfigError, match=r"is a symbolic link, not a folder"):
        prepare(where)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "argv",
    [
        ["sleep", "600"],
        ["sh", "-c", "read line", "nvidia-cuda-mps-control"],  # a builtin: no child to leave
        ["tail", "-f", "/dev/null", "/x/nvidia-cuda-mps-control"],
    ],
    ids=["sleep", "named-in-arguments", "a-file-of-that-name"],
)
def test_a_process_merely_naming_the_daemon_is_not_it(
    tmp_path: Path, mps: Callable[..., Result], argv: list[str]
) -> None:
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            pid_file = tmp_path / "pipe" / PID_FILE
            pid_file.parent.mkdir()
            pid_file.write_text(f"{proc.pid}\n")
            assert mps("stop").returncode == 1
            assert proc.poll() is None and not pid_file.exists()
        finally:
            proc.kill()
