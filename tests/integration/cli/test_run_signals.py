"""`nodeagent run` as a process under hostile signalling: bursts of SIGHUP, then SIGTERM.

The agent's stderr goes to a file (a pipe nobody reads would fill with a burst's log lines and
block the agent: that would test the pipe, not the agent)."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

GOOD = "version: nodeagent/v1\nreconcile: {interval: 3600}\n"
BAD = "version: nodeagent/v1\nreconcile: {interval: nan}\n"


class Process:
    """`nodeagent --simulate h200 run --config FILE` with its stderr in a file."""

    def __init__(
        self, tmp_path: Path, settings: Path, extra_env: dict[str, str], **popen: object
    ) -> None:
        self.log = tmp_path / "stderr.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        env.update(extra_env)
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "--simulate", "h200", "--log-level", "info", "run",
                 "--config", str(settings), "--metrics-address", "127.0.0.1:0"],
                stderr=err, stdout=subprocess.DEVNULL, env=env, **popen,  # type: ignore[call-overload]
            )  # fmt: skip
        port = re.search(r"metrics on port (\d+)", self.until("metrics on port"))
        assert port is not None
        self.port = int(port.group(1))

    def text(self) -> str:
        return self.log.read_text()

    def until(self, words: str, count: int = 1, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if text.count(words) >= count:
                return text
            assert self.proc.poll() is None, f"the agent ended ({self.proc.returncode}): {text}"
            time.sleep(0.05)
        raise AssertionError(f"no {words!r} x{count} within {timeout} s: {self.text()[-2000:]}")

    def burst(self, signum: int, count: int) -> None:
        for i in range(count):
            os.kill(self.proc.pid, signum)
            if i % 100 == 99:
                time.sleep(0.002)  # land some of them mid-reload, not only in one read


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def run(env: dict[str, str] | None = None, **popen: object) -> Process:
        settings = tmp_path / "nodeagent.yaml"
        settings.write_text(GOOD)
        started.append(Process(tmp_path, settings, env or {}, **popen))
        return started[-1]

    yield run
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def test_sighup_bursts_then_sigterm_reload_and_exit_0(
    start: Callable[..., Process], tmp_path: Path
) -> None:
    agent = start()
    settings = tmp_path / "nodeagent.yaml"
    for round_ in range(1, 6):
        agent.burst(signal.SIGHUP, 1000)
        agent.until("settings.reloaded", count=round_)  # each burst: at least one reload
    # A reload after the bursts still reads the file: a bad one is refused and said so.
    settings.write_text(BAD)
    agent.proc.send_signal(signal.SIGHUP)
    agent.until("settings.reload.failed")
    settings.write_text(GOOD)
    agent.burst(signal.SIGHUP, 1000)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=20) == 0
    text = agent.text()
    assert "Traceback" not in text and "RecursionError" not in text
    assert "agent.stopping" in text


FD_LIMIT = 32


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_a_reload_the_system_refuses_is_reported_and_tried_again(
    start: Callable[..., Process], tmp_path: Path
) -> None:
    """`ulimit -n 32`, every descriptor taken by idle connections: a SIGHUP's reload cannot
    open the settings file. It is not lost: a log line, /readyz 503 with the reason (asked
    over a connection opened before), and once descriptors are free again, the reload."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # systemd's side (sd_notify)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.setblocking(False)
    agent = start({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}, preexec_fn=_limit_fds)
    kept = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)

    def readyz() -> tuple[int, str]:
        kept.request("GET", "/readyz")
        answer = kept.getresponse()
        return answer.status, answer.read().decode()

    deadline = time.monotonic() + 30
    while readyz()[0] != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.1)
    fillers: list[socket.socket] = []
    try:
        while "Too many open files" not in agent.text():
            assert len(fillers) < 2 * FD_LIMIT, "the agent never ran out of descriptors"
            fillers.append(socket.create_connection(("127.0.0.1", agent.port)))
            time.sleep(0.05)
            readyz()  # the kept connection stays alive (idle ones close after 5 s)
        (tmp_path / "nodeagent.yaml").write_text(GOOD.replace("3600", "1800"))
        agent.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (answer := readyz())[0] != 503:
            assert time.monotonic() < deadline, f"/readyz never said so: {answer}"
            time.sleep(0.1)
        assert "settings reload not done" in answer[1] and "Too many open files" in answer[1]
        failed = [line for line in agent.text().splitlines() if "settings.reload.failed" in line]
        assert failed and "retry_seconds" in failed[0] and "Too many open files" in failed[0]
        assert "settings.reloaded" not in agent.text()
        # systemd still hears of the attempt: the notify socket needs no free descriptor.
        said = []
        with contextlib.suppress(BlockingIOError):
            while True:
                said.append(notify.recv(4096).decode())
        reloading = [i for i, m in enumerate(said) if m.startswith("RELOADING=1")]
        assert reloading and "READY=1" in said[reloading[-1] + 1 :], said
    finally:
        notify.close()
        for filler in fillers:
            filler.close()
    agent.until("settings.reloaded")
    deadline = time.monotonic() + 30
    while readyz()[0] != 200:
        assert time.monotonic() < deadline, "not ready after the reload"
        time.sleep(0.1)
    kept.close()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=20) == 0
    assert "Traceback" not in agent.text()
