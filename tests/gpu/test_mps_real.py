"""The real nvidia-cuda-mps-control, started and supervised by nodeagent, with torch clients.

Private pipe and log directories under a temporary folder; no compute-mode change; the daemon
is told to `quit` at the end. Read-only towards the GPU's settings.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.mps.control import parent_pid
from nodeagent.mps.daemon import MpsDaemon
from nodeagent.mps.settings import MpsSettings, validate
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import load_real_library, open_session, read_inventory
from nodeagent.state.workers import Worker

pytestmark = pytest.mark.gpu
GIB = 1 << 30

CLIENT = """
import json, sys, time, torch
props = torch.cuda.get_device_properties(0)
out = {"sms": props.multi_processor_count}
x = torch.ones(1024, 1024, device="cuda")
(x @ x).sum().item()
if len(sys.argv) > 1:
    try:
        big = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
        big.fill_(1); torch.cuda.synchronize()
        out["alloc"] = "ok"
    except torch.OutOfMemoryError as err:
        out["alloc"] = "oom"
time.sleep(1.0)
print(json.dumps(out), flush=True)
"""


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[tuple[MpsDaemon, MpsSettings]]:
    pytest.importorskip("torch")
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        pytest.skip("nvidia-cuda-mps-control not installed")
    try:
        inventory = read_inventory(open_session(load_real_library()))
    except NvmlError as err:
        pytest.skip(f"no NVML here: {err}")
    settings = MpsSettings(
        devices=(0,),
        replicas=4,
        pinned_memory={0: "2G"},
        pipe_dir=tmp_path / "pipe",
        log_dir=tmp_path / "log",
        ready_file=tmp_path / "ready",
        control_binary=binary,
        probe_interval_seconds=0.5,
    )
    daemon = MpsDaemon(settings, validate(settings, inventory))
    try:
        yield daemon, settings
    finally:
        daemon.stop()
        assert daemon.control.daemon_pid() is None


def _client(settings: MpsSettings, *args: str) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        CUDA_MPS_PIPE_DIRECTORY=str(settings.pipe_dir),
        CUDA_MPS_LOG_DIRECTORY=str(settings.log_dir),
    )
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    data: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return data


def test_real_daemon_limits_clients(mps: tuple[MpsDaemon, MpsSettings]) -> None:
    daemon, settings = mps
    status = daemon.start()
    print(f"started: {status.to_dict()}")
    assert (
        status.running and status.thread_percentage == 25.0 and status.pinned_bytes == {0: 2 * GIB}
    )
    assert json.loads(settings.ready_file.read_text())["running"] is True
    clients = [_client(settings), _client(settings)]
    deadline = time.monotonic() + 60  # a cold torch import can take several seconds
    during = daemon.status()
    while not any(during.clients.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        during = daemon.status()
    print(f"with clients: servers {during.servers} clients {during.clients}")
    results = [_result(c) for c in clients]
    print(f"clients saw: {results}")
    assert all(r["sms"] == 32 for r in results)  # 25 % of 132 SMs, as in the probe
    assert during.servers and sum(len(c) for c in during.clients.values()) >= 1
    # What stop relies on: the real daemon is recognised from its pid file (its executable),
    # and its servers are its children (only those are ever killed).
    print(f"server parents: {[parent_pid(s) for s in during.servers]}; daemon {status.pid}")
    assert daemon.control.daemon_pid() == status.pid
    assert all(parent_pid(s) == status.pid for s in during.servers)
    over = _result(_client(settings, str(3 * GIB)))
    under = _result(_client(settings, str(GIB)))
    print(f"3 GiB over a 2 GiB limit: {over['alloc']}; 1 GiB: {under['alloc']}")
    assert over["alloc"] == "oom" and under["alloc"] == "ok"


def test_killed_real_daemon_is_restarted(mps: tuple[MpsDaemon, MpsSettings]) -> None:
    daemon, settings = mps
    old = daemon.start().pid
    assert old
    stop = threading.Event()
    supervisor = MpsSupervisor()
    worker = Worker(
        "mps-probe",
        lambda: supervisor.check_once(daemon),
        lambda: settings.probe_interval_seconds,
        stop,
    )
    worker.start()
    try:
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        while daemon.restarts == 0 and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        took = time.monotonic() - t0
        status = daemon.status()
        print(f"restarted in {took:.2f} s: {status.to_dict()}")
        assert daemon.restarts == 1 and status.pid != old
        assert status.thread_percentage == 25.0 and status.pinned_bytes == {0: 2 * GIB}
        result = _result(_client(settings))
        assert result["sms"] == 32
    finally:
        stop.set()
        worker.wake()
        worker.join(5)


HOLD = """
import json, sys, time, torch
props = torch.cuda.get_device_properties(0)
x = torch.ones(1024, 1024, device="cuda")
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    (x @ x).sum().item()
    time.sleep(0.05)
print(json.dumps({"sms": props.multi_processor_count}), flush=True)
"""


def test_agent_restart_keeps_the_real_daemon_and_its_client(
    mps: tuple[MpsDaemon, MpsSettings],
) -> None:
    """The agent runs MPS, a CUDA client works under it; the agent stops (a rollout) and a new
    one starts: the same daemon is adopted and the client never notices."""
    from tests.support.agent import make_agent

    _, settings = mps
    session = open_session(load_real_library())
    mps_settings = {
        "enabled": True,
        "devices": (0,),
        "replicas": 4,
        "pinned_memory": "0=2G",
        "pipe_dir": settings.pipe_dir,
        "log_dir": settings.log_dir,
        "ready_file": settings.ready_file,
        "control": settings.control_binary,
    }

    def start() -> object:
        agent = make_agent(session, lambda _i: None, mps=mps_settings)
        agent.start()
        report = agent.pipeline.last_report
        assert report is not None and report.result == "success", report
        return agent

    first = start()
    assert first.mps.status is not None  # type: ignore[attr-defined]
    daemon_pid = first.mps.status.pid  # type: ignore[attr-defined]
    client = subprocess.Popen(
        [sys.executable, "-c", HOLD, "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(
            os.environ,
            CUDA_MPS_PIPE_DIRECTORY=str(settings.pipe_dir),
            CUDA_MPS_LOG_DIRECTORY=str(settings.log_dir),
        ),
    )
    deadline = time.monotonic() + 60
    while not (first.mps.refresh_status() or first.mps.status).servers:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline and client.poll() is None, "no MPS server appeared"
        time.sleep(0.2)
    servers = first.mps.status.servers  # type: ignore[attr-defined]
    first.stop()  # type: ignore[attr-defined]
    assert client.poll() is None, "the client died with the agent"
    second = start()
    status = second.mps.status  # type: ignore[attr-defined]
    print(f"daemon {daemon_pid} -> {status.pid}; servers {servers} -> {status.servers}")
    assert status.pid == daemon_pid and status.servers == servers
    assert not second.mps.started_by_us  # type: ignore[attr-defined]
    result = _result(client)
    assert result["sms"] == 32  # 25 % of 132 SMs, through the adopted daemon
    second.stop()  # type: ignore[attr-defined]
