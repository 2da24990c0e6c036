"""The metrics endpoint in a process of its own: the agent's log after the hostile cases and
SIGTERM, and a server whose descriptors run out (RLIMIT_NOFILE lowered in the child)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.metrics.test_endpoint_hostile import (
    EXPOSITION,
    STALLED,
    exchange,
    scrape,
    statuses,
)
from tests.support.metrics import wait_for

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 30.0  # a bound on waits that normally end in a second or two
SERVER = """
import resource, sys
from nodeagent.base.logs import configure_logging
from nodeagent.metrics.server import MetricsServer
from tests.integration.metrics.test_endpoint_hostile import EXPOSITION, exposing
configure_logging("debug", "json")
server = MetricsServer("127.0.0.1:0", exposing(EXPOSITION), lambda: (True, "ok"),
                       lambda: (True, "ok"), idle_timeout_seconds=60.0)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
server.start()
sys.stdin.read()
server.stop()
"""


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


class Child:
    """A child process with its stderr in a file (a pipe nobody reads would block it)."""

    def __init__(self, args: list[str], log: Path, port_pattern: str) -> None:
        self.log = log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                env=clean_env(), text=True,
            )  # fmt: skip
        self.port = int(wait_for(lambda: self.find(port_pattern), "the port", TIMEOUT))

    def find(self, pattern: str) -> str | None:
        assert self.proc.poll() is None, f"ended ({self.proc.returncode}): {self.text()}"
        found = re.search(pattern, self.text())
        return found.group(1) if found else None

    def text(self) -> str:
        return self.log.read_text()

    def events(self, name: str) -> list[dict[str, object]]:
        lines = [json.loads(x) for x in self.text().splitlines() if x.startswith("{")]
        return [e for e in lines if e.get("event") == name]

    def end(self) -> None:
        try:
            self.proc.communicate(timeout=TIMEOUT)  # its stdin closed: it stops
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.end()


def limited_server(tmp_path: Path, children: list[Child], nofile: int) -> Child:
    """A server whose process may hold `nofile` descriptors, logging at debug."""
    child = Child([sys.executable, "-c", SERVER, str(nofile)], tmp_path / "server.log",
                  r'"port": (\d+)')  # fmt: skip
    children.append(child)
    return child


def test_the_agents_log_holds_no_traceback_after_hostile_cases_and_sigterm(
    tmp_path: Path, children: list[Child]
) -> None:
    settings = tmp_path / "nodeagent.yaml"
    settings.write_text("version: nodeagent/v1\nreconcile: {interval: 3600}\n")
    agent = Child(
        [sys.executable, "-m", "nodeagent", "--simulate", "h200", "--log-level", "info", "run",
         "--config", str(settings), "--metrics-address", "127.0.0.1:0"],
        tmp_path / "agent.log", r"metrics on port (\d+)",
    )  # fmt: skip
    children.append(agent)
    one = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    assert statuses(exchange("127.0.0.1", agent.port, one * 1000)) == [200] * 1000
    big = b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 70_000 + b"\r\n\r\n"
    for bad in (big, b"hello\r\n\r\n", b"GET /metrics HTTP/2.0\r\n\r\n", b"GET /metr"):
        assert statuses(exchange("127.0.0.1", agent.port, one + bad))[0] == 200
    odd_accept = b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.x\r\n"
    assert statuses(exchange("127.0.0.1", agent.port, odd_accept + b"\r\n")) == [200]
    stalled = []  # still open at SIGTERM
    for head in STALLED.values():
        sock = socket.create_connection(("127.0.0.1", agent.port), timeout=TIMEOUT)
        sock.sendall(head)
        stalled.append(sock)
    try:
        assert scrape("127.0.0.1", agent.port, "/healthz") == (200, b"ok\n")
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(TIMEOUT) == 0
    finally:
        for sock in stalled:
            sock.close()
    log = agent.text()
    assert "Traceback" not in log
    loud = [x for x in log.splitlines() if '"level": "warning"' in x or '"level": "error"' in x]
    assert not loud


def test_clients_whose_body_never_comes_leave_no_descriptor_behind(
    tmp_path: Path, children: list[Child]
) -> None:
    """256 descriptors, 300 clients sending a head whose body never comes: once they have
    closed, /healthz answers (they were held, descriptors and all, until the agent ended)."""
    server = limited_server(tmp_path, children, 256)
    clients = [socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
               for _ in range(300)]  # fmt: skip
    try:
        for sock, head in zip(clients, list(STALLED.values()) * 60, strict=True):
            sock.sendall(head)
    finally:
        for sock in clients:
            sock.close()

    def healthy() -> bool:
        return scrape("127.0.0.1", server.port, "/healthz") == (200, b"ok\n")

    assert wait_for(healthy, "/healthz to answer", TIMEOUT)


def test_exhausted_descriptors_are_logged_once_not_once_a_second(
    tmp_path: Path, children: list[Child]
) -> None:
    """asyncio retries a failed accept every second; the warning says it once (each repeat
    at debug, counted), and the server answers again once descriptors are free."""
    server = limited_server(tmp_path, children, 64)
    held = []
    try:
        for _ in range(80):  # more than the server may accept; the rest wait in its backlog
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT))
        wait_for(lambda: len(server.events("http.accept_failed")) >= 3, "3 failed accepts",
                 TIMEOUT)  # fmt: skip
        failed = server.events("http.accept_failed")
        assert [e["level"] for e in failed[:3]] == ["warning", "debug", "debug"]
        assert [e["repeated"] for e in failed[:3]] == [0, 1, 2]
    finally:
        for sock in held:
            sock.close()

    def answers() -> bool:
        return scrape("127.0.0.1", server.port) == (200, EXPOSITION)

    assert wait_for(answers, "a scrape to be answered", TIMEOUT)
    assert [e["level"] for e in server.events("http.accept_failed")].count("warning") == 1
