"""NVIDIA's real device plugin (built from source: `make device-plugin`, carried in .build/)
serving MPS from nodeagent's daemon on a real GPU, driven by tests/support/fake_kubelet.

nodeagent runs as `nodeagent run` in the device-plugin layout under a temporary MPS root, in a
mount namespace whose /dev/shm is `<root>/shm` (what the DaemonSet's MPS component gives it).
The unmodified plugin registers with the fake kubelet, probes the daemon through `/mps/...`
(a symlink to the root for the run), advertises 4 replicas and answers Allocate; a torch client
started with exactly the env and mounts Allocate returned sees the thread and memory limits.
Then the daemon is killed: nodeagent restarts it and the plugin keeps serving. EXCLUSIVE_PROCESS
stays off (the lent card's rules); everything made for the run is removed after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_kubelet.kubelet import FakeKubelet

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(os.environ.get("NODEAGENT_DEVICE_PLUGIN", REPO / ".build" / "nvidia-device-plugin"))
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CONFIG = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)
RESOURCE = "nvidia.com/gpu"
GIB = 1 << 30

CLIENT = """
import json, os, sys, torch
props = torch.cuda.get_device_properties(0)
out = {"sms": props.multi_processor_count, "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}
for name, size in (("under", 30 << 30), ("over", 40 << 30)):
    try:
        t = torch.empty(size, dtype=torch.uint8, device="cuda"); t.fill_(1)
        torch.cuda.synchronize(); out[name] = "ok"; del t; torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        out[name] = "oom"
print(json.dumps(out), flush=True)
"""


def _needs() -> None:
    pytest.importorskip("torch")
    needs_plugin()


def needs_plugin() -> None:
    """Skips unless the real plugin can run here: root, the tools, the binary, /mps free."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces, /var/lib/kubelet, /mps)")
    for tool in ("nvidia-cuda-mps-control", "unshare", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    if not PLUGIN.exists():
        pytest.skip(f"no device plugin binary at {PLUGIN} (make device-plugin)")
    if Path("/mps").exists() and not Path("/mps").is_symlink():
        pytest.skip("/mps exists and is not ours")


@pytest.fixture
def stage() -> Iterator[Path]:
    _needs()
    with staged() as work:
        yield work


@contextlib.contextmanager
def staged() -> Iterator[Path]:
    """A work folder with `<work>/mps` reachable as /mps and the kubelet's plugin folder; all
    removed after."""
    work = Path(tempfile.mkdtemp(prefix="nodeagent-dp-"))
    made_plugin_dir = not PLUGIN_DIR.exists()
    PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    root = work / "mps"
    os.symlink(root, "/mps")
    try:
        yield work
    finally:
        Path("/mps").unlink(missing_ok=True)
        subprocess.run(["umount", str(root / "shm")], check=False, capture_output=True)
        if made_plugin_dir:
            shutil.rmtree(PLUGIN_DIR, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _nodeagent(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodeagent", *args]


def start_agent(stage: Path, root: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The init container's step (`mps mount-shm`), then `nodeagent run` with <root>/shm as
    its /dev/shm (what the DaemonSet's MPS component gives it); its log in <stage>/agent.log."""
    shm = subprocess.run(_nodeagent("mps", "mount-shm"), env=env, capture_output=True, text=True)
    assert shm.returncode == 0, shm.stderr
    print("mount-shm:", shm.stdout.strip())
    agent_cmd = " ".join(_nodeagent("run"))
    return subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount --bind {root}/shm /dev/shm && exec {agent_cmd}"],
        env=env, stderr=open(stage / "agent.log", "w"), cwd=REPO,
    )  # fmt: skip


def start_plugin(
    stage: Path, config: Path, root: Path, kubelet: FakeKubelet, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """The unmodified plugin on `config`, MPS root `root`, registering with `kubelet`; its
    health checks off (they would mark a GPU unhealthy on XIDs of other tests); its log in
    <stage>/plugin.log."""
    return subprocess.Popen(
        [str(PLUGIN), f"--config-file={config}", f"--mps-root={root}",
         f"--kubelet-socket={kubelet.socket_path}", "--driver-root-ctr-path=/",
         "--device-discovery-strategy=nvml"],
        env={**env, "DP_DISABLE_HEALTHCHECKS": "all"},
        stdout=open(stage / "plugin.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def _pid(root: Path) -> int | None:
    try:
        return int((root / RESOURCE / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    except (OSError, ValueError):
        return None


def _wait(predicate: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


def _client(allocation: object) -> dict[str, object]:
    """The client as the kubelet would start its container: Allocate's env, and its mounts as
    bind mounts (host path -> container path) in a mount namespace of its own."""
    envs = dict(os.environ, **allocation.envs)  # type: ignore[attr-defined]
    binds = " && ".join(
        f"mkdir -p {m.container_path} && mount --bind {m.host_path} {m.container_path}"
        for m in allocation.mounts  # type: ignore[attr-defined]
    )
    script = f'{binds} && exec {sys.executable} -c "$CLIENT"'
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env={**envs, "CLIENT": CLIENT}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_real_plugin_serves_mps_from_nodeagents_daemon(stage: Path) -> None:
    root = stage / "mps"
    config = stage / "dp.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(
        NODEAGENT_MPS="true", NODEAGENT_MPS_LAYOUT="device-plugin", NODEAGENT_MPS_ROOT=str(root),
        NODEAGENT_MPS_DEVICE_PLUGIN_CONFIG=str(config), NODEAGENT_MPS_EXCLUSIVE_PROCESS="false",
        NODEAGENT_MPS_PROBE_INTERVAL="0.5", NODEAGENT_MPS_STOP_ON_EXIT="true",
        NODEAGENT_METRICS_ADDRESS="127.0.0.1:0", NODEAGENT_LOG_LEVEL="info",
    )  # fmt: skip
    agent = start_agent(stage, root, env)
    plugin = None
    try:
        _wait(lambda: (root / ".ready").exists() or agent.poll() is not None, "nodeagent ready")
        assert agent.poll() is None, (stage / "agent.log").read_text()[-3000:]
        assert (root / RESOURCE / ".started").exists()
        with FakeKubelet(PLUGIN_DIR) as kubelet:
            plugin = start_plugin(stage, config, root, kubelet, env)
            registration = kubelet.wait_for_registration(90, RESOURCE)
            print("registered:", registration)
            session = kubelet.drive(RESOURCE, 1, 60)
            assert len(session.devices) == 4 and all(d.health == "Healthy" for d in session.devices)
            allocation = session.allocation
            assert allocation is not None
            print("allocate:", json.dumps(session.to_dict()["allocation"]))
            assert allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/{RESOURCE}/pipe"
            mounts = {m.container_path: m.host_path for m in allocation.mounts}
            assert mounts == {
                f"/mps/{RESOURCE}/pipe": f"{root}/{RESOURCE}/pipe",
                "/dev/shm": f"{root}/shm",
            }
            seen = _client(allocation)
            print("client:", seen)
            assert seen["sms"] == 32  # 25 % of 132 SMs (as measured on the H200)
            assert seen["under"] == "ok" and seen["over"] == "oom"
            # The daemon dies; nodeagent restarts it; the plugin keeps serving.
            old = _pid(root)
            assert old is not None
            os.kill(old, signal.SIGKILL)
            _wait(lambda: _pid(root) not in (None, old) and (root / ".ready").exists(), "restart")
            print(f"daemon {old} killed, nodeagent restarted it as {_pid(root)}")
            again = kubelet.drive(RESOURCE, 1, 60)
            assert again.allocation is not None and len(again.devices) == 4
            seen = _client(again.allocation)
            print("client after the restart:", seen)
            assert seen["under"] == "ok" and seen["over"] == "oom"
    finally:
        if plugin is not None:
            plugin.terminate()
            plugin.wait(30)
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
        print(
            "plugin log tail:",
            (stage / "plugin.log").read_text()[-1500:] if (stage / "plugin.log").exists() else "",
        )
    assert _pid(root) is None  # stop-on-exit: the daemon is gone
