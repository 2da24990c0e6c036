"""`nodeagent run` and `nodeagent metrics` as processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Result, assert_one_error


def test_metrics_prints_one_exposition(cli: Callable[..., Result]) -> None:
    res = cli("--simulate", "h200x2", "metrics")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("nodeagent_gpu_info{") == 2
    assert 'nodeagent_collector_success{collector="gpus"} 1.0' in res.stdout


def test_run_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodeagent",
            "--simulate",
            "h200",
            "--sim-state",
            str(tmp_path / "s.json"),
            "run",
            "--metrics-address",
            "127.0.0.1:0",
            "--refresh-interval",
            "0.5",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        port = None
        deadline = time.monotonic() + 30
        assert proc.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            match = re.search(r"metrics on port (\d+)", line)
            if match:
                port = int(match.group(1))
        assert port, "the agent did not say its port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b"nodeagent_gpu_memory_total_bytes" in resp.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_refuses_bad_settings(cli: Callable[..., Result]) -> None:
    assert_one_error(
        cli("--simulate", "h200", "run", "--metrics-address", "nowhere"), 2, "HOST:PORT"
    )
    assert_one_error(cli("--simulate", "h200", "run", "--gpm-interval", "0.01"), 2, "at least 0.1")
    assert_one_error(
        cli("--simulate", "h200", "run", "-c", "all-balanced"), 2, "both the file and the name"
    )
