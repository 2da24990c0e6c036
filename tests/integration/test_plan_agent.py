"""The agent with `sharing.workload-file`: it plans the node from the workload file and keeps
the planned sharing config applied through the same pipeline as a named one; a changed file is
planned again, an unchanged one is not; a bad file fails the desire step and changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.agent.service import Agent
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.planner.hook import FILE_NAME
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cli import Result, assert_one_error

VOICE = """\
version: nodeagent/v1
workloads:
  - {name: llm, replicas: 2, memory: 38G, isolation: mig, priority: 10}
  - {name: asr, replicas: 10, memory: 10G, isolation: shared, compute: 0.1}
"""
MIG_ONLY = """\
version: nodeagent/v1
workloads:
  - {name: embed, replicas: 7, memory: 8G, isolation: mig}
"""


@pytest.fixture
def node(tmp_path: Path, fake_mps_control: str) -> Iterator[tuple[Agent, SimulatedNvml, Path]]:
    lib = SimulatedNvml(parse_spec("h200x4"))
    session = NvmlSession(lib)
    (tmp_path / "w.yaml").write_text(VOICE)
    agent = make_agent(
        session,
        lib.reset,
        node={"run_dir": tmp_path / "run"},
        sharing={"workload_file": str(tmp_path / "w.yaml")},
        mps={"root": tmp_path / "mps", "control": fake_mps_control, "stop_on_exit": True},
    )
    yield agent, lib, tmp_path
    agent.stop()
    control = MpsControl(fake_mps_control, tmp_path / "mps" / "pipe", tmp_path / "mps" / "log")
    if control.daemon_pid() is not None:
        control.command("quit")


def _profiles(lib: SimulatedNvml) -> dict[int, dict[str, int]]:
    session = NvmlSession(lib)
    out: dict[int, dict[str, int]] = {}
    for gpu in read_inventory(session).gpus:
        counts: dict[str, int] = {}
        for s in gpu.slices:
            counts[s.profile] = counts.get(s.profile, 0) + 1
        out[gpu.index] = counts
    return out


def test_agent_applies_the_planned_config(node: tuple[Agent, SimulatedNvml, Path]) -> None:
    agent, lib, tmp = node
    report = agent.pipeline.run_once()
    assert report.result == "success", report.reason
    assert report.wanted.sharing_config == "planned"
    planned = yaml.safe_load((tmp / "run" / FILE_NAME).read_text())
    entries = planned["sharing-configs"]["planned"]
    mps_gpus = sorted(i for e in entries if "mps" in e for i in e["devices"])
    assert mps_gpus and agent.mps.serving == tuple(mps_gpus)
    mig = {i: e["mig"]["mig-devices"] for e in entries if "mig" in e for i in e["devices"]}
    have = _profiles(lib)
    assert all(have[i] == counts for i, counts in mig.items()) and mig
    assert {i: s for i, (s, _) in report.sharing.items() if s != "whole"} == {
        **dict.fromkeys(mig, "mig"),
        **dict.fromkeys(mps_gpus, "mps"),
    }
    # Unchanged file, unchanged GPUs: no new plan, nothing to do, the file is not rewritten.
    mtime = (tmp / "run" / FILE_NAME).stat().st_mtime_ns
    again = agent.pipeline.run_once()
    assert again.result == "success" and again.operations == 0 and again.mps_change == "none"
    assert (tmp / "run" / FILE_NAME).stat().st_mtime_ns == mtime


def test_a_changed_file_is_planned_again(node: tuple[Agent, SimulatedNvml, Path]) -> None:
    agent, lib, tmp = node
    assert agent.pipeline.run_once().result == "success"
    (tmp / "w.yaml").write_text(MIG_ONLY)
    report = agent.pipeline.run_once()
    assert report.result == "success", report.reason
    assert agent.mps.serving == ()
    have = _profiles(lib)
    assert have[0] == {"1g.18gb": 7} and have[1] == have[2] == have[3] == {}


def test_a_bad_workload_file_fails_the_desire_step(
    node: tuple[Agent, SimulatedNvml, Path],
) -> None:
    agent, lib, tmp = node
    (tmp / "w.yaml").write_text("version: nodeagent/v1\nworkloads:\n  - {name: a, memory: 1G}\n")
    report = agent.pipeline.run_once()
    assert report.result == "failure" and report.step == "desire"
    assert (
        report.reason
        == f"desire: {tmp / 'w.yaml'}:3:5: workload 'a': missing 'isolation' (mig, shared, exclusive)"
    )
    assert _profiles(lib) == {0: {}, 1: {}, 2: {}, 3: {}}
    assert not (tmp / "run" / FILE_NAME).exists()


def test_workload_file_and_a_named_config_are_refused(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / "w.yaml").write_text(VOICE)
    res = cli("config", "check", "--workload-file", "w.yaml", "--sharing-file", "s.yaml",
              "--sharing-config", "x", "-o", "json")  # fmt: skip
    assert_one_error(res, 2, "--workload-file", "--sharing-config", "not both")
    ok = cli("config", "check", "--workload-file", "w.yaml", "-o", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["settings"]["sharing"]["workload-file"] == "w.yaml"


def test_on_the_emulator_the_planned_config_is_written_beside_its_state(tmp_path: Path) -> None:
    """`run --workload-file` on the emulator writes its planned sharing config beside the
    emulator's state file, as the MIG writer lock, never in the host's run directory (here
    --run-dir, which today's /run/nodeagent stands for); a second emulated node in the same
    folder keeps its own."""
    (tmp_path / "w.yaml").write_text(MIG_ONLY)
    state = tmp_path / "node.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    with (tmp_path / "stderr.log").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "--simulate", "h200", "--sim-state", str(state),
             "--run-dir", str(tmp_path / "run"), "run", "--workload-file", str(tmp_path / "w.yaml"),
             "--metrics-address", "127.0.0.1:0", "--reconcile-interval", "3600"],
            stdout=subprocess.DEVNULL, stderr=err, env=env,
        )  # fmt: skip
    planned = tmp_path / f".node.json.{FILE_NAME}"
    try:
        deadline = time.monotonic() + 30
        while not (planned.exists() or (tmp_path / "run" / FILE_NAME).exists()):
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert yaml.safe_load(planned.read_text())["sharing-configs"]["planned"]
    assert not (tmp_path / "run" / FILE_NAME).exists()
