"""The agent and the ownership record's lock, as a process on the emulator (issue 44 classes 1
and 9): an agent starting while another process holds `.owners.json.lock` waits for it within
mig.lock-timeout, serves /healthz meanwhile, changes no GPU and stops on SIGTERM; an agent
stopped in the middle of a MIG change ends it between two NVML operations, as `mig apply`
does, with the record consistent and the next apply finishing the change."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nodeagent.state.owners import OWNERS_NAME
from tests.integration.cli.test_record_lock import held
from tests.support.cli import Result

TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _agent(
    tmp_path: Path, port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The agent on the emulator, its log in agent.log; killed if still running at the end."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    args = [sys.executable, "-m", "nodeagent", "--simulate", "h200", "--sim-state",
            str(tmp_path / "node.json"), "--log-format", "json", "--log-level", "info", "run", "--metrics-address",
            f"127.0.0.1:{port}", "--reconcile-interval", "3600", "--mig-config-file",
            str(tmp_path / "configs.yaml"), "--mig-config", "all-1g.18gb"]  # fmt: skip
    with (tmp_path / "agent.log").open("w") as log:
        proc = subprocess.Popen(args, env={**base, **(env or {})}, stdout=subprocess.DEVNULL,
                                stderr=log, text=True)  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _until(what: str, check: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert proc.poll() is None, f"the agent ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {TIMEOUT:g} s"
        time.sleep(0.05)


def _healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return None


def _events(tmp_path: Path, name: str) -> list[dict[str, object]]:
    lines = (tmp_path / "agent.log").read_text().splitlines()
    return [e for e in (json.loads(x) for x in lines if x.startswith("{")) if e["event"] == name]


def _stopped(proc: subprocess.Popen[str]) -> float:
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=TIMEOUT)
    return time.monotonic() - began


def _configs(cli: Callable[..., Result], tmp_path: Path) -> list[str]:
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    (tmp_path / "configs.yaml").write_text(cli(*base, "mig", "generate-config").stdout)
    return base


def test_an_agent_starting_while_the_record_is_held_serves_and_stops(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    base = _configs(cli, tmp_path)
    port = _free_port()
    with held(tmp_path / f".{OWNERS_NAME}.lock"), _agent(tmp_path, port) as proc:
        _until("/healthz answer", lambda: _healthz(port) == 200, proc)
        took = _stopped(proc)
    text = (tmp_path / "agent.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in text, text
    assert took < 10, took
    assert not _events(tmp_path, "mig.operation")  # no GPU changed
    (waited,) = _events(tmp_path, "lock.waiting")
    assert waited["lock"] == "the ownership record's lock"
    status = json.loads(cli(*base, "status", "-o", "json").stdout)
    assert [(g["mig_current"], g["slices"]) for g in status["gpus"]] == [(False, [])]


def test_sigterm_stops_the_agents_mig_change_between_two_operations(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    base = _configs(cli, tmp_path)
    configs = ["-f", str(tmp_path / "configs.yaml"), "-c", "all-1g.18gb"]
    # 15 operations, the 7 GPU instances 0.4 s each: about 3 s of NVML writes
    with _agent(tmp_path, _free_port(), {"NODEAGENT_SIM_LATENCY": "create-gi=0.4"}) as proc:
        _until("MIG operation", lambda: len(_events(tmp_path, "mig.operation")) >= 2, proc)
        took = _stopped(proc)
    text = (tmp_path / "agent.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in text, text
    done = len(_events(tmp_path, "mig.operation"))
    assert 2 <= done < 15, done  # ended between two operations, not at the end of the change
    assert took < 10, took
    assert f"after {done} of 15 NVML operations" in text, text
    # Consistent: the record names no config the GPUs do not have, the lock is free, and the
    # next apply finishes the change.
    record = tmp_path / OWNERS_NAME
    assert not record.exists() or '"all-1g.18gb"' not in record.read_text()
    assert cli(*base, "mig", "assert", *configs).returncode == 1
    again = cli(*base, "mig", "apply", *configs, "--lock-timeout", "0")
    assert again.returncode == 0, again.stderr
    assert cli(*base, "mig", "assert", *configs).returncode == 0
