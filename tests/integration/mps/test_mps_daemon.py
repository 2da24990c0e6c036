"""The MPS lifecycle against a fake nvidia-cuda-mps-control that speaks the real protocol."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError, MpsError
from nodeagent.mps.control import MpsControl
from nodeagent.mps.control import process_alive as _alive
from nodeagent.mps.daemon import MpsDaemon
from nodeagent.mps.settings import MpsSettings, parse_pinned, parse_size, validate
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import Inventory, MigWriter, NvmlSession, read_inventory
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.workers import Worker

GIB = 1 << 30


@pytest.fixture
def node() -> tuple[NvmlSession, Inventory]:
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2")))
    return session, read_inventory(session)


@pytest.fixture
def settings(tmp_path: Path, fake_mps_control: str) -> Callable[..., MpsSettings]:
    def make(**kw: object) -> MpsSettings:
        base: dict[str, object] = {
            "devices": (0,),
            "replicas": 4,
            "pipe_dir": tmp_path / "pipe",
            "log_dir": tmp_path / "log",
            "ready_file": tmp_path / "ready",
            "control_binary": fake_mps_control,
            "command_timeout_seconds": 2.0,
            "probe_interval_seconds": 0.3,
        }
        base.update(kw)
        return MpsSettings(**base)  # type: ignore[arg-type]

    return make


@pytest.fixture
def daemons() -> Iterator[list[MpsDaemon]]:
    started: list[MpsDaemon] = []
    yield started
    for d in started:
        d.stop()


def test_start_sets_limits_reads_them_back_and_writes_ready(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    daemons: list[MpsDaemon],
) -> None:
    _, inv = node
    s = settings(devices=(0, 1), pinned_memory={0: "2G", 1: "6144M"})
    daemon = MpsDaemon(s, validate(s, inv))
    daemons.append(daemon)
    status = daemon.start()
    assert status.running and status.pid and _alive(status.pid)
    assert status.thread_percentage == 25.0  # 100 // replicas
    assert status.pinned_bytes == {0: 2 * GIB, 1: 6 * GIB}
    ready = json.loads(s.ready_file.read_text())
    assert ready["thread_percentage"] == 25.0 and ready["pinned_memory_limit_bytes"] == {
        "0": 2 * GIB,
        "1": 6 * GIB,
    }
    log = (s.log_dir / "control.log").read_text()
    assert "Cmd:set_default_active_thread_percentage 25" in log
    assert "Cmd:set_default_device_pinned_mem_limit 1 6144M" in log  # by device index, not UUID


def test_default_pinned_limit_is_memory_over_replicas(
    node: tuple[NvmlSession, Inventory], settings: Callable[..., MpsSettings]
) -> None:
    _, inv = node
    limits = validate(settings(replicas=4), inv)
    assert limits.pinned_bytes == {0: inv.gpus[0].memory_total_bytes // 4 >> 30 << 30}  # whole GiB
    assert limits.visible_devices == inv.gpus[0].uuid


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"replicas": 1}, "replicas must be 2 or more"),
        ({"thread_percentage": 0}, "thread percentage must be 1-100"),
        ({"thread_percentage": 150}, "thread percentage must be 1-100"),
        ({"devices": (5,)}, "GPU 5 does not exist"),
        ({"devices": (0, 0)}, "listed twice"),
        ({"pinned_memory": {0: "lots"}}, "'lots' is not a size"),
        ({"pinned_memory": {0: "999G"}}, "more than its"),
        ({"pinned_memory": {1: "2G"}}, "GPU 1, which is not under MPS"),
    ],
)
def test_bad_values_are_refused_before_anything_starts(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    kw: dict[str, object],
    words: str,
) -> None:
    _, inv = node
    s = settings(**kw)
    with pytest.raises(ConfigError, match=words):
        validate(s, inv)
    assert not s.pipe_dir.exists()


def test_mps_on_a_mig_gpu_is_refused(
    node: tuple[NvmlSession, Inventory], settings: Callable[..., MpsSettings]
) -> None:
    session, _ = node
    MigWriter(session).set_mig_mode(1, True)
    with pytest.raises(ConfigError, match="GPU 1 has MIG enabled"):
        validate(settings(devices=(1,)), read_inventory(session))


def test_limits_that_do_not_hold_fail_and_stop_the_daemon(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, inv = node
    monkeypatch.setenv("FAKE_MPS_IGNORE_SETS", "1")
    s = settings()
    daemon = MpsDaemon(s, validate(s, inv))
    with pytest.raises(
        MpsError,
        match=r"thread percentage is 100.0, wanted 25.*pinned memory limit of MPS device 0 is unset",
    ):
        daemon.start()
    assert daemon.control.daemon_pid() is None and not s.ready_file.exists()


def test_stop_leaves_nothing_running(
    node: tuple[NvmlSession, Inventory], settings: Callable[..., MpsSettings]
) -> None:
    _, inv = node
    s = settings()
    daemon = MpsDaemon(s, validate(s, inv))
    pid = daemon.start().pid
    assert pid
    daemon.stop()
    assert not _alive(pid) and not s.ready_file.exists()
    assert not daemon.status().running
    daemon.stop()  # idempotent


def test_start_adopts_a_running_daemon(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    daemons: list[MpsDaemon],
) -> None:
    _, inv = node
    s = settings()
    first = MpsDaemon(s, validate(s, inv))
    daemons.append(first)
    pid = first.start().pid
    second = MpsDaemon(s, validate(s, inv))
    assert second.start().pid == pid  # the agent restarted; the clients' daemon stays


def test_killed_daemon_is_restarted_with_its_limits(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    daemons: list[MpsDaemon],
) -> None:
    _, inv = node
    s = settings(pinned_memory={0: "3G"})
    daemon = MpsDaemon(s, validate(s, inv))
    daemons.append(daemon)
    old = daemon.start().pid
    assert old
    stop = threading.Event()
    supervisor = MpsSupervisor()
    worker = Worker(
        "mps-probe", lambda: supervisor.check_once(daemon), lambda: s.probe_interval_seconds, stop
    )
    worker.start()
    try:
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + 10
        status = daemon.status()
        while time.monotonic() < deadline and daemon.restarts == 0:
            time.sleep(0.1)
        status = daemon.status()
        assert status.running and status.pid != old, "not restarted within 10 s"
        assert status.thread_percentage == 25.0 and status.pinned_bytes == {0: 3 * GIB}
        assert daemon.restarts == 1 and supervisor.failed_probes == 1
        print(f"restarted after {time.monotonic() - killed:.2f} s")
    finally:
        stop.set()
        worker.wake()
        worker.join(5)


def test_a_hung_daemon_fails_its_probe_within_the_timeout(
    node: tuple[NvmlSession, Inventory],
    settings: Callable[..., MpsSettings],
    daemons: list[MpsDaemon],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, inv = node
    hang = tmp_path / "hang"
    monkeypatch.setenv("FAKE_MPS_HANG_FILE", str(hang))
    s = settings(command_timeout_seconds=0.5)
    daemon = MpsDaemon(s, validate(s, inv))
    daemons.append(daemon)
    old = daemon.start().pid
    hang.touch()
    t0 = time.monotonic()
    assert not daemon.probe()
    assert time.monotonic() - t0 < 2
    hang.unlink()
    daemon.restart()  # kills the hung one, starts anew
    assert daemon.probe() and daemon.control.daemon_pid() != old


def test_exclusive_process_is_an_option_restored_on_stop(
    node: tuple[NvmlSession, Inventory], settings: Callable[..., MpsSettings]
) -> None:
    session, inv = node
    modes = ComputeModeWriter(session)
    s = settings(exclusive_process=True)
    daemon = MpsDaemon(s, validate(s, inv), modes)
    daemon.start()
    assert modes.compute_mode(0) == 3 and modes.compute_mode(1) == 0
    daemon.stop()
    assert modes.compute_mode(0) == 0
    plain = MpsDaemon(settings(), validate(settings(), inv), modes)
    plain.start()
    assert modes.compute_mode(0) == 0  # off by default
    plain.stop()


def test_control_answers_as_the_real_daemon(
    settings: Callable[..., MpsSettings], fake_mps_control: str
) -> None:
    s = settings()
    control = MpsControl(fake_mps_control, s.pipe_dir, s.log_dir, 2)
    with pytest.raises(MpsError, match="Cannot find MPS control daemon process"):
        control.command("get_server_list")
    control.start_daemon("0")
    try:
        with pytest.raises(MpsError, match="already running"):
            control.start_daemon("0")
        assert control.command("set_default_active_thread_percentage 150") == "100.0"
        assert control.command("no_such_command") == 'Unknown command "no_such_command"'
    finally:
        control.command("quit")


@pytest.mark.parametrize(
    ("text", "n"),
    [("2G", 2 * GIB), ("2048M", 2 * GIB), ("512MiB", 512 << 20), ("4GB", 4 * GIB), ("1t", 1 << 40)],
)
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_pinned_forms() -> None:
    assert parse_pinned("2G", (0, 1)) == {0: "2G", 1: "2G"}
    assert parse_pinned("0=2G,1=4G", (0, 1)) == {0: "2G", 1: "4G"}
    with pytest.raises(ConfigError):
        parse_pinned("a=2G", (0,))
