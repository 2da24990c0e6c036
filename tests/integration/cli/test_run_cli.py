"""`nodeagent run` as a process (signals, reload, faults in its workers), `nodeagent metrics`,
`nodeagent config check`, and settings errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]


def test_metrics_prints_one_exposition(cli: Cli) -> None:
    res = cli("--simulate", "h200x2", "metrics")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("nodeagent_gpu_info{") == 2
    assert 'nodeagent_collector_success{collector="gpus"} 1.0' in res.stdout


class Agent:
    """A `nodeagent run` process on an emulated node; its port read from stderr."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        full = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        full.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nodeagent", *args],
            stderr=subprocess.PIPE,
            text=True,
            env=full,
        )
        self.port = 0
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        lines = []
        while not self.port and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            lines.append(line)
            match = re.search(r"metrics on port (\d+)", line)
            if match:
                self.port = int(match.group(1))
        assert self.port, "the agent did not say its port: " + "".join(lines)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_for(self, path: str, predicate: Callable[[int, str], bool], what: str) -> str:
        deadline = time.monotonic() + 30
        last: tuple[int, str] = (0, "")
        while time.monotonic() < deadline:
            last = self.get(path)
            if predicate(*last):
                return last[1]
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last {path}: {last}")

    def metric(self, name: str) -> float | None:
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


@pytest.fixture
def node(tmp_path: Path, cli: Cli) -> Iterator[Callable[..., Agent]]:
    """Start agents on one emulated 2xH200 node (a shared state file) with a MIG file."""
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*base, "mig", "generate-config").stdout)
    agents: list[Agent] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Agent:
        agent = Agent([*base, "run", "--metrics-address", "127.0.0.1:0", *args], env)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()


def test_run_serves_and_stops_on_sigterm(node: Callable[..., Agent]) -> None:
    agent = node("--refresh-interval", "0.5")
    assert "nodeagent_gpu_memory_total_bytes" in agent.get("/metrics")[1]
    assert agent.get("/readyz") == (200, "ok\n")
    assert agent.get("/healthz") == (200, "ok\n")
    assert agent.stop() == 0


def test_bad_mig_file_fails_reconcile_and_recovers_with_drift_corrected(
    node: Callable[..., Agent], tmp_path: Path, cli: Cli
) -> None:
    """One non-UTF-8 byte in the MIG file while the agent runs: the reconcile fails with a
    reason naming its step, /readyz says so, /healthz stays ok (the worker lives); drift made
    meanwhile is corrected once the file is fixed."""
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    mig = tmp_path / "mig.yaml"
    good = mig.read_bytes()
    agent = node("-f", str(mig), "-c", "all-balanced", "--reconcile-interval", "0.2")
    agent.wait_for("/readyz", lambda c, _: c == 200, "first reconcile")
    mig.write_bytes(good.replace(b"# ", b"# \xff ", 1) if b"# " in good else b"\xff" + good)
    body = agent.wait_for("/readyz", lambda c, _: c == 503, "the failure")
    assert body.startswith("resolve: MIG config file") and "not UTF-8" in body
    assert agent.get("/healthz") == (200, "ok\n")
    # Drift while the file is bad: someone takes MIG off GPU 1 by hand.
    assert cli(*base, "mig", "apply", "-f", "-", "-c", "off", stdin=_OFF_GPU1).returncode == 0
    off = cli(*base, "mig", "assert", "-f", "-", "-c", "off", stdin=_OFF_GPU1)
    # As mig-parted asserts: a config that leaves a GPU out is not "applied" on this node.
    assert (
        off.returncode == 1
        and "GPU 0 (NVIDIA H200): config 'off' does not specify it" in off.stdout
    )
    assert "GPU 1" not in off.stdout  # GPU 1 is as the config says
    mig.write_bytes(good)
    agent.wait_for("/readyz", lambda c, _: c == 200, "recovery")
    assert cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-balanced").returncode == 0
    assert agent.metric('nodeagent_worker_errors_total{worker="reconcile"}') == 0.0
    assert agent.stop() == 0


_OFF_GPU1 = """version: v1
mig-configs:
  off:
    - devices: [1]
      mig-enabled: false
"""


def test_sighup_reloads_config_name_and_interval(
    node: Callable[..., Agent], tmp_path: Path, cli: Cli
) -> None:
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    settings = tmp_path / "nodeagent.yaml"
    mig = tmp_path / "mig.yaml"
    settings.write_text(
        "version: nodeagent/v1\n"
        f"mig: {{config-file: {mig}, config: all-balanced}}\n"
        "reconcile: {interval: 3600}\n"
    )
    agent = node("--config", str(settings))
    agent.wait_for("/readyz", lambda c, _: c == 200, "first reconcile")
    assert cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-balanced").returncode == 0
    settings.write_text(
        "version: nodeagent/v1\n"
        f"mig: {{config-file: {mig}, config: all-3g.71gb}}\n"
        "reconcile: {interval: 0.5}\n"
        "metrics: {address: '127.0.0.1:1'}\n"  # restart-only: refused, the old one stays
    )
    agent.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-3g.71gb").returncode != 0:
        assert time.monotonic() < deadline, "the new config name was not applied"
        time.sleep(0.1)
    assert agent.metric("nodeagent_config_reload_success") == 1.0
    assert agent.get("/healthz")[0] == 200  # still serving on the old address
    # The new interval holds: a drift is corrected within seconds, not an hour.
    assert cli(*base, "mig", "apply", "-f", "-", "-c", "off", stdin=_OFF_GPU1).returncode == 0
    deadline = time.monotonic() + 30  # each phase has its own (a loaded CI machine is slow)
    while cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-3g.71gb").returncode != 0:
        assert time.monotonic() < deadline, "the new interval did not take effect"
        time.sleep(0.1)
    # A bad file: the old settings stay, the reload metric says 0.
    settings.write_text("version: nodeagent/v1\nreconcile: {interval: nan}\n")
    agent.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while agent.metric("nodeagent_config_reload_success") != 0.0:
        assert time.monotonic() < deadline, "the failed reload was not reported"
        time.sleep(0.05)
    assert agent.get("/readyz")[0] == 200 and agent.proc.poll() is None
    assert agent.stop() == 0


def test_refresh_worker_survives_an_nvml_error_storm(node: Callable[..., Agent]) -> None:
    """After the first read, every memory read fails: each refresh fails, is counted, and the
    worker goes on (with backoff); /healthz stays ok while the worker lives and the last good
    inventory is recent; the next reconcile fails and /readyz names its step."""
    rules = [
        {"function": "nvmlDeviceGetMemoryInfo", "call": n, "error": "UNKNOWN"}
        for n in range(3, 300)
    ]
    faults = json.dumps(rules)
    agent = node("--refresh-interval", "0.1", env={"NODEAGENT_SIM_FAULTS": faults})
    deadline = time.monotonic() + 20
    while (agent.metric('nodeagent_worker_errors_total{worker="refresh"}') or 0) < 2:
        assert time.monotonic() < deadline, "refresh errors not counted"
        time.sleep(0.05)
    assert agent.get("/healthz") == (200, "ok\n")
    errors = agent.metric('nodeagent_nvml_errors_total{function="nvmlDeviceGetMemoryInfo"}')
    assert errors is not None and errors >= 2
    assert agent.stop() == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--metrics-address", "nowhere"], ["--metrics-address", "HOST:PORT"]),
        (["--gpm-interval", "0.01"], ["--gpm-interval", "at least 0.1"]),
        (["--refresh-interval", "nan"], ["--refresh-interval", "finite", "nan"]),
        (["--refresh-interval", "inf"], ["--refresh-interval", "finite", "inf"]),
        (["--reconcile-interval", "0"], ["--reconcile-interval", "> 0"]),
        (["--mps-probe-interval", "nan"], ["--mps-probe-interval", "finite"]),
        (["--clients-wait-seconds", "-1"], ["--clients-wait-seconds", "> 0"]),
        (["-c", "all-balanced"], ["both the file and the name"]),
        (["--kube"], ["NODE_NAME"]),
        (["--kube", "--node-name", "n", "-c", "x", "-f", "y"], ["comes from the node label"]),
        (["--pause-component", "oops!"], ["--pause-component", "NAME=KEY=VALUE"]),
    ],
)
def test_run_refuses_bad_settings(cli: Cli, args: list[str], words: list[str]) -> None:
    assert_one_error(cli("--simulate", "h200", "run", *args), 2, *words)


def test_bad_environment_is_one_line_for_the_commands_that_use_it(cli: Cli) -> None:
    env = {"NODEAGENT_MPS_REPLICAS": "abc", "NODEAGENT_REFRESH_INTERVAL": "nan"}
    assert cli("--help", env=env).returncode == 0
    assert cli("--simulate", "h200", "status", env=env).returncode == 0
    res = cli("--simulate", "h200", "run", env={"NODEAGENT_REFRESH_INTERVAL": "nan"})
    assert_one_error(res, 2, "NODEAGENT_REFRESH_INTERVAL", "finite")


def test_config_check_prints_effective_settings_and_sources(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "nodeagent.yaml"
    path.write_text("version: nodeagent/v1\nmetrics:\n  refresh-interval: 2\n")
    res = cli(
        "config", "check", "--config", str(path), "--reconcile-interval", "9",
        env={"NODEAGENT_LABEL_PREFIX": "gpu.example.com/"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "  refresh-interval: 2.0\n" in res.stdout and "  interval: 9.0\n" in res.stdout
    assert f"# metrics.refresh-interval: from file {path}:3:21" in res.stdout
    assert "# reconcile.interval: from flag --reconcile-interval" in res.stdout
    assert "# labels.prefix: from env NODEAGENT_LABEL_PREFIX" in res.stdout
    # What it prints is itself a valid settings file.
    again = tmp_path / "again.yaml"
    again.write_text(res.stdout)
    assert cli("config", "check", "--config", str(again)).returncode == 0
    path.write_text("version: nodeagent/v1\nmetrics:\n  refresh-intervall: 2\n")
    assert_one_error(
        cli("config", "check", "--config", str(path)), 2, f"{path}:3:3", "refresh-intervall"
    )


def test_sigterm_while_starting_against_an_unreachable_api_exits(tmp_path: Path) -> None:
    """The first read of the Node retries (the API is down): SIGTERM ends the retries and the
    process, exit 0 (a stop asked for, not a failure) with one line saying what it cut short,
    instead of hanging in start-up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodeagent", "--simulate", "h200x2", "--log-level", "info",
         "run", "--kube", "--node-name", "n1", "--kube-host", "http://127.0.0.1:1",
         "--metrics-address", "127.0.0.1:0", "--pod-resources-socket", ""],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until it is retrying
            if "kube.retry" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        rest = proc.stderr.read()
        assert "Traceback" not in rest and "nodeagent: " not in rest
        assert "agent.stopped_while_starting" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
