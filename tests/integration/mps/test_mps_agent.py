"""MPS inside the agent and through the CLI: started, published (labels, metrics), stopped."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from prometheus_client import generate_latest

from nodeagent.agent import Agent, AgentConfig
from nodeagent.mps.settings import MpsSettings
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.conftest import Result, assert_one_error

FAKE = str(Path(__file__).resolve().parents[2] / "fake_mps" / "nvidia-cuda-mps-control")


def test_agent_runs_publishes_and_stops_mps(tmp_path: Path) -> None:
    settings = MpsSettings(
        devices=(0, 1),
        replicas=4,
        pipe_dir=tmp_path / "pipe",
        log_dir=tmp_path / "log",
        ready_file=tmp_path / "ready",
        control_binary=FAKE,
        probe_interval_seconds=0.2,
    )
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2")))
    features = tmp_path / "features.d" / "nodeagent"
    config = AgentConfig(metrics_address="127.0.0.1:0", mps=settings, nfd_features_file=features)
    agent = Agent(session, config, lambda i: None)
    agent.start()
    try:
        assert agent.mps_daemon is not None
        pid = agent.mps_daemon.control.daemon_pid()
        assert pid
        text = generate_latest(agent.registry).decode()
        assert "nodeagent_mps_daemon_up 1.0" in text
        assert "nodeagent_mps_active_thread_ratio 0.25" in text
        assert (
            'nodeagent_mps_pinned_memory_limit_bytes{device="1"} 3.7580963840e+10' in text
            or 'device="1"} 3.758096384e+10' in text
        )
        assert "nodeagent_mps_restarts_total 0.0" in text
        lines = features.read_text().splitlines()
        assert "nvidia.com/gpu.sharing-strategy=mps" in lines
        assert "nvidia.com/gpu.replicas=4" in lines
        assert "nvidia.com/mps.capable=true" in lines
    finally:
        agent.stop()
    assert agent.mps_daemon.control.daemon_pid() is None
    assert not settings.ready_file.exists()


def test_mps_cli(cli: Callable[..., Result], tmp_path: Path) -> None:
    flags = [
        "--simulate",
        "h200x2",
        "--sim-state",
        str(tmp_path / "s.json"),
        "mps",
        "-o",
        "json",
        "--mps-control",
        FAKE,
        "--mps-pipe-dir",
        str(tmp_path / "p"),
        "--mps-log-dir",
        str(tmp_path / "l"),
        "--mps-ready-file",
        str(tmp_path / "ready"),
    ]
    start = [flags[0], flags[1], flags[2], flags[3], "mps", "start", *flags[5:]]
    status = [flags[0], flags[1], flags[2], flags[3], "mps", "status", *flags[5:]]
    stop = [flags[0], flags[1], flags[2], flags[3], "mps", "stop", *flags[5:]]
    res = cli(*start, "--mps-replicas", "2", "--mps-pinned-memory", "0=8G,1=16G")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["running"] and data["thread_percentage"] == 50.0
    assert data["pinned_memory_limit_bytes"] == {"0": 8 << 30, "1": 16 << 30}
    res = cli(*status)
    assert res.returncode == 0 and json.loads(res.stdout)["running"]
    assert cli(*stop).returncode == 0
    res = cli(*status)
    assert res.returncode == 1 and json.loads(res.stdout)["running"] is False
    assert_one_error(
        cli(*start, "--mps-thread-percentage", "150", "--mps-replicas", "1"),
        2,
        "replicas must be 2 or more",
        "thread percentage must be 1-100",
    )
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").glob("*.pid"))
