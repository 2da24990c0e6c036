"""`nodeagent run` under a Type=notify unit, end to end: the test plays systemd's side of the
notify protocol (sd_notify(3)): it binds NOTIFY_SOCKET, sets WATCHDOG_USEC, and reads what the
agent process sends. No systemd runs here (not PID 1 in this container, no user manager)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

WATCHDOG_USEC = 400_000  # pings every 0.2 s
ROOT = Path(__file__).resolve().parents[2]

# A worker made to die: the emulator's kill fault, raised in the thread that makes the call
# (FaultPlan.in_process) instead of ending the process. Only the gpm worker calls
# nvmlGpmSampleGet, so exactly that worker's thread ends, as a crashed thread would.
KILL_ONE_THREAD = """
import sys
from nodeagent.sim import faults
from_env = faults.FaultPlan.from_env.__func__
faults.FaultPlan.from_env = classmethod(
    lambda cls: faults.FaultPlan(from_env(cls).faults, in_process=True))
from nodeagent.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Unit:
    """The agent process and the notify socket it reports to (systemd's side)."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
                 program: list[str] | None = None) -> None:  # fmt: skip
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(tmp_path / "notify.sock"))
        full = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        full.update(env or {}, NOTIFY_SOCKET=str(tmp_path / "notify.sock"),
                    WATCHDOG_USEC=str(WATCHDOG_USEC), PYTHONPATH=str(ROOT))  # fmt: skip
        self.stderr = tmp_path / "stderr.log"
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [*(program or [sys.executable, "-m", "nodeagent"]), "--simulate", "h200",
                 "run", "--metrics-address", "127.0.0.1:0", *args],
                env=full, stderr=err, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        self.messages: list[dict[str, str]] = []  # every datagram, as its fields

    def receive(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        message = dict(line.split("=", 1) for line in data.split("\n"))
        self.messages.append(message)
        return message

    def until(self, key: str, value: str | None = None, timeout: float = 30) -> dict[str, str]:
        """The next message carrying `key` (with `value`, or containing it for STATUS)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.receive(deadline - time.monotonic())
            if message is None or key not in message:
                continue
            if value is None or message[key] == value or (key == "STATUS" and value in message[key]):  # fmt: skip
                return message
        raise AssertionError(f"no {key}={value or ''} within {timeout} s; got {self.messages[-8:]}")

    def quiet(self, key: str, seconds: float) -> list[dict[str, str]]:
        """Everything received for `seconds`; asserts none of it carries `key`."""
        got, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None:
                got.append(message)
        assert not [m for m in got if key in m], f"{key} sent: {got}"
        return got

    def port(self) -> int:
        for line in self.stderr.read_text().splitlines():
            if "metrics on port" in line:
                return int(line.split("metrics on port ")[1].split(":")[0].split()[0])
        raise AssertionError("no port in the log")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port()}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


@pytest.fixture
def units(tmp_path: Path) -> Iterator[list[Unit]]:
    made: list[Unit] = []
    yield made
    for unit in made:
        unit.close()


def test_ready_after_nvml_and_first_reconcile_watchdog_status_reload_stopping(
    tmp_path: Path, units: list[Unit]
) -> None:
    """NVML refuses once (a driver still loading): STATUS says it waits and a log line says
    why; READY=1 with MAINPID comes after the first reconcile; WATCHDOG=1 every half
    WatchdogSec while healthy; STATUS= a one-line summary; RELOADING=1 then READY=1 around
    SIGHUP; STOPPING=1 on SIGTERM and exit 0."""
    faults = [{"function": "nvmlInit", "call": 1, "error": "DRIVER_NOT_LOADED"}]
    env = {"NODEAGENT_SIM_FAULTS": json.dumps(faults), "NODEAGENT_NVML_WAIT": "60"}
    unit = Unit(tmp_path, [], env)
    units.append(unit)
    waiting = unit.until("STATUS", "waiting for NVML")
    assert "Driver Not Loaded" in waiting["STATUS"]
    ready = unit.until("READY", "1")
    assert ready["MAINPID"] == str(unit.proc.pid)
    before = [m for m in unit.messages[:-1] if "STATUS" in m]
    assert [m["STATUS"] for m in before][-1] == "first reconcile"  # nothing else in between
    status = unit.until("STATUS", "reconcile ok")["STATUS"]
    assert status == "1 GPU; reconcile ok (config none); healthy"
    unit.until("WATCHDOG", "1")
    began = time.monotonic()
    for _ in range(5):
        unit.until("WATCHDOG", "1")
    assert time.monotonic() - began < 5 * WATCHDOG_USEC / 1e6 + 1.5  # every half WatchdogSec
    unit.proc.send_signal(signal.SIGHUP)
    unit.until("RELOADING", "1")
    assert "MONOTONIC_USEC" in unit.messages[-1]
    unit.until("READY", "1")
    unit.proc.send_signal(signal.SIGTERM)
    unit.until("STOPPING", "1")
    assert unit.proc.wait(timeout=20) == 0
    log = [json.loads(x) for x in unit.stderr.read_text().splitlines() if x.startswith("{")]
    (wait_line,) = [e for e in log if e["event"] == "nvml.waiting"]
    assert wait_line["level"] == "warning" and "Driver Not Loaded" in wait_line["error"]


def test_nvml_never_answering_ends_the_wait_with_one_sentence_and_exit_3(tmp_path: Path) -> None:
    """Every nvmlInit refused: after node.nvml-wait the agent exits 3 (a restart's business:
    Restart=on-failure, the kubelet), saying why in one sentence, never READY=1."""
    faults = [{"function": "nvmlInit", "error": "DRIVER_NOT_LOADED"}]
    env = {"NODEAGENT_SIM_FAULTS": json.dumps(faults), "NODEAGENT_NVML_WAIT": "0.5"}
    unit = Unit(tmp_path, [], env)
    try:
        assert unit.proc.wait(timeout=30) == 3
        while unit.receive(0.1) is not None:
            pass
        assert [m for m in unit.messages if "READY" in m] == []
        lines = unit.stderr.read_text().splitlines()
        assert lines[-1].startswith(
            "nodeagent: NVML nvmlInit failed (still refused after the 0.5 s node.nvml-wait): "
            "Driver Not Loaded"
        )
        assert "Traceback" not in "\n".join(lines)
    finally:
        unit.close()


def test_ready_waits_for_a_successful_reconcile(tmp_path: Path, units: list[Unit]) -> None:
    """A first reconcile that fails (a config the file lacks) is no start: no READY=1, STATUS
    says why, the watchdog is still fed (the agent is healthy); once the file has the config,
    the next reconcile succeeds and READY=1 follows."""
    mig = tmp_path / "mig.yaml"
    mig.write_text(
        "version: v1\nmig-configs:\n  other:\n    - devices: all\n      mig-enabled: false\n"
    )
    unit = Unit(tmp_path, ["-f", str(mig), "-c", "all-disabled", "--reconcile-interval", "0.3"])
    units.append(unit)
    failed = unit.until("STATUS", "reconcile failed")
    assert "no config named 'all-disabled'" in failed["STATUS"], failed
    unit.until("WATCHDOG", "1")
    assert not [m for m in unit.messages if "READY" in m]
    unit.quiet("READY", 1.0)
    mig.write_text(mig.read_text().replace("other:", "all-disabled:"))
    unit.until("READY", "1")
    assert "reconcile ok (config all-disabled)" in unit.until("STATUS", "reconcile ok")["STATUS"]
    unit.proc.send_signal(signal.SIGTERM)
    assert unit.proc.wait(timeout=20) == 0


def test_a_dead_worker_stops_the_watchdog(tmp_path: Path, units: list[Unit]) -> None:
    """The gpm worker's thread dies on its 5th sample: /healthz turns 503, STATUS names the
    worker, and WATCHDOG=1 stops, so systemd (WatchdogSec) would restart the agent."""
    faults = [{"function": "nvmlGpmSampleGet", "call": 5, "exit": 137}]
    unit = Unit(tmp_path, ["--gpm-interval", "0.1"], {"NODEAGENT_SIM_FAULTS": json.dumps(faults)},
                program=[sys.executable, "-c", KILL_ONE_THREAD])  # fmt: skip
    units.append(unit)
    unit.until("READY", "1")
    unit.until("WATCHDOG", "1")
    status = unit.until("STATUS", "unhealthy")["STATUS"]
    assert status.endswith("unhealthy: worker gpm is not running"), status
    got = unit.quiet("WATCHDOG", 10 * WATCHDOG_USEC / 1e6)  # five watchdog periods
    assert unit.get("/healthz") == (503, "worker gpm is not running\n")
    assert unit.proc.poll() is None and all("STOPPING" not in m for m in got)
    assert "SimulatedCrash" in unit.stderr.read_text()  # the thread's end, in the log
