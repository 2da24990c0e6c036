"""MPS as a resource the agent's pipeline reconciles (fake control daemon): started, published,
adopted across an agent restart without touching its clients, converged on a reload, refused
where MIG would meet it, quit on exit only when asked; and `nodeagent mps` by hand."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cli import Result


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def mps_node(
    tmp_path: Path, fake_mps_control: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Agent]]:
    """Agents on one emulated 2xH200 node sharing one MPS pipe directory."""
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    mig = tmp_path / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    mps = {
        "enabled": True,
        "replicas": 4,
        "pipe_dir": tmp_path / "pipe",
        "log_dir": tmp_path / "log",
        "ready_file": tmp_path / "ready",
        "control": fake_mps_control,
    }
    agents: list[Agent] = []

    def start(mig_config: str | None = None, **mps_overrides: Any) -> Agent:
        agent = make_agent(
            session,
            lib.reset,
            mps={**mps, **mps_overrides},
            mig={"config_file": str(mig), "config": mig_config},
            labels={"nfd_features_file": tmp_path / "features"},
            reconcile={"interval_seconds": 3600},
        )
        agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()
    control = MpsControl(fake_mps_control, tmp_path / "pipe", tmp_path / "log")
    if control.daemon_pid() is not None:
        control.command("quit")


def test_agent_runs_and_publishes_mps(mps_node: Callable[..., Agent], tmp_path: Path) -> None:
    agent = mps_node()
    assert agent.pipeline.last_report is not None
    assert agent.pipeline.last_report.result == "success"
    assert agent.mps.daemon is not None and agent.mps.serving == (0, 1)
    value = agent.registry.get_sample_value
    assert value("nodeagent_mps_daemon_up") == 1.0
    assert value("nodeagent_mps_active_thread_ratio") == 0.25
    assert value("nodeagent_mps_pinned_memory_limit_bytes", {"device": "1"}) == 35 << 30
    lines = (tmp_path / "features").read_text().splitlines()
    assert "nvidia.com/gpu.sharing-strategy=mps" in lines
    assert "nvidia.com/gpu.replicas=4" in lines
    assert "nvidia.com/mps.capable=true" in lines  # only where nodeagent runs MPS
    assert json.loads((tmp_path / "ready").read_text())["running"]


def test_agent_restart_keeps_the_daemon_and_its_clients(
    mps_node: Callable[..., Agent], tmp_path: Path
) -> None:
    first = mps_node()
    assert first.mps.status is not None
    daemon_pid = first.mps.status.pid
    (server,) = first.mps.status.servers
    assert daemon_pid and first.mps.status.clients == {server: [4242]}
    first.stop()  # a rollout or `systemctl restart`
    assert _alive(daemon_pid) and _alive(server)
    assert (tmp_path / "ready").exists()  # clients and the device plugin still see it ready
    second = mps_node()
    assert second.mps.status is not None
    assert second.mps.status.pid == daemon_pid  # adopted, not restarted
    assert second.mps.status.servers == [server] and _alive(server)
    assert not second.mps.started_by_us


def test_stop_on_exit_quits_the_daemon(mps_node: Callable[..., Agent], tmp_path: Path) -> None:
    agent = mps_node(stop_on_exit=True)
    assert agent.mps.status is not None and agent.mps.status.pid
    pid = agent.mps.status.pid
    agent.stop()
    assert not _alive(pid) and not (tmp_path / "ready").exists()


def test_mig_on_an_mps_gpu_is_refused_at_resolve(mps_node: Callable[..., Agent]) -> None:
    agent = mps_node(mig_config="all-balanced", devices=(0,))
    report = agent.pipeline.last_report
    assert report is not None and report.result == "failure" and report.step == "resolve"
    assert "enables MIG on GPU 0, which mps.devices puts under MPS" in (report.reason or "")
    assert agent.ready() == (False, report.reason)
    # Nothing changed: no MIG, and no MPS either.
    snap = agent.store.snapshot
    assert snap is not None and not any(g.mig_current for g in snap.inventory.gpus)
    assert agent.mps.daemon is None


def test_mig_on_the_gpu_a_running_daemon_serves_is_refused(
    mps_node: Callable[..., Agent],
) -> None:
    """MPS on every GPU without MIG (the default), then a MIG config for all GPUs arrives on a
    reload: refused, the daemon and the GPUs stay as they are."""
    agent = mps_node()
    assert agent.mps.serving == (0, 1)
    agent.reload(
        dataclasses.replace(
            agent.settings, mig=dataclasses.replace(agent.settings.mig, config="all-balanced")
        )
    )
    report = agent.pipeline.run_once()
    assert report.step == "resolve"
    assert "enables MIG on GPU 0, which the running MPS daemon serves" in (report.reason or "")
    assert agent.mps.serving == (0, 1)


def test_mps_with_clients_is_neither_stopped_nor_moved(mps_node: Callable[..., Agent]) -> None:
    """Turning MPS off (a reload) or restarting the agent for other GPUs would end the running
    clients: refused, the daemon keeps serving them."""
    agent = mps_node()
    assert agent.mps.status is not None and agent.mps.status.clients
    pid = agent.mps.status.pid
    agent.reload(
        dataclasses.replace(
            agent.settings, mps=dataclasses.replace(agent.settings.mps, enabled=False)
        )
    )
    report = agent.pipeline.run_once()
    assert report.step == "plan" and "serves 1 clients" in (report.reason or "")
    assert agent.mps.daemon is not None and agent.mps.refresh_status() is not None
    agent.stop()
    other = mps_node(devices=(0,))  # the running daemon serves GPUs 0 and 1
    report = other.pipeline.last_report
    assert report is not None and report.step == "apply"
    assert "already runs" in (report.reason or "") and "other GPUs" in (report.reason or "")
    assert other.mps.daemon is None and _alive(pid)


def test_reload_changes_the_limits_without_a_restart(mps_node: Callable[..., Agent]) -> None:
    agent = mps_node()
    assert agent.mps.status is not None
    pid = agent.mps.status.pid
    new = dataclasses.replace(
        agent.settings,
        mps=dataclasses.replace(agent.settings.mps, thread_percentage=40, pinned_memory="0=8G"),
    )
    assert agent.reload(new) == []
    report = agent.pipeline.run_once()
    assert report.result == "success" and report.mps_change == "limits"
    status = agent.mps.refresh_status()
    assert status is not None and status.pid == pid  # the same daemon: clients undisturbed
    assert status.thread_percentage == 40.0 and status.pinned_bytes[0] == 8 << 30


def test_a_failed_start_leaves_nothing_running(
    mps_node: Callable[..., Agent], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon ignores the limits (as the real one ignores a bad value): the agent stops
    the daemon it started and reports why."""
    monkeypatch.setenv("FAKE_MPS_IGNORE_SETS", "1")
    agent = mps_node()
    report = agent.pipeline.last_report
    assert report is not None and report.step == "apply"
    assert "MPS limits did not hold" in (report.reason or "")
    assert agent.mps.daemon is None
    assert not list((tmp_path / "pipe").glob("*.pid")) and not (tmp_path / "ready").exists()


def test_mps_cli(cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str) -> None:
    common = [
        "-o",
        "json",
        "--mps-control",
        fake_mps_control,
        "--mps-pipe-dir",
        str(tmp_path / "p"),
        "--mps-log-dir",
        str(tmp_path / "l"),
        "--mps-ready-file",
        str(tmp_path / "ready"),
    ]
    node = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "s.json"), "mps"]
    res = cli(*node, "start", *common, "--mps-replicas", "2", "--mps-pinned-memory", "0=8G,1=16G")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["running"] and data["thread_percentage"] == 50.0
    assert data["pinned_memory_limit_bytes"] == {"0": 8 << 30, "1": 16 << 30}
    res = cli(*node, "status", *common)
    assert res.returncode == 0 and json.loads(res.stdout)["running"]
    assert cli(*node, "stop", *common).returncode == 0
    res = cli(*node, "status", *common)
    assert res.returncode == 1 and json.loads(res.stdout)["running"] is False
    res = cli(*node, "start", *common, "--mps-thread-percentage", "150", "--mps-replicas", "1")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.splitlines()[0] == "nodeagent: 2 settings errors:"
    assert "--mps-replicas: must be >= 2, not 1" in res.stderr
    assert "--mps-thread-percentage: must be 1-100, not 150" in res.stderr
    res = cli(*node, "status", *common, env={"NODEAGENT_MPS_REPLICAS": "abc"})
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "nodeagent: environment variable NODEAGENT_MPS_REPLICAS: must be a whole number, not 'abc'"
    )
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").glob("*.pid"))
    assert os.environ.get("NODEAGENT_MPS_REPLICAS") is None
