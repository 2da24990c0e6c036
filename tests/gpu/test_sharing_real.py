"""A per-GPU sharing config on the real H200 (read-only towards MIG: the config leaves MIG off):
`nodeagent sharing apply` puts GPU 0 under MPS — the daemon serves that GPU only — the labels
say so, and a torch client sees the limits. Private MPS root, exclusive-process off, the daemon
quit at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import load_real_library, open_session, read_inventory

pytestmark = pytest.mark.gpu
CONFIG = """version: nodeagent/v1
sharing-configs:
  embeddings:
    - devices: [0]
      mps: {replicas: 4, pinned-memory: 2G}
"""
CLIENT = """
import json, torch
props = torch.cuda.get_device_properties(0)
out = {"sms": props.multi_processor_count, "count": torch.cuda.device_count()}
for name, size in (("under", 1 << 30), ("over", 3 << 30)):
    try:
        t = torch.empty(size, dtype=torch.uint8, device="cuda"); t.fill_(1)
        torch.cuda.synchronize(); out[name] = "ok"; del t; torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        out[name] = "oom"
print(json.dumps(out), flush=True)
"""


def test_sharing_config_puts_one_gpu_under_mps(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        pytest.skip("nvidia-cuda-mps-control not installed")
    try:
        inventory = read_inventory(open_session(load_real_library()))
    except NvmlError as err:
        pytest.skip(f"no NVML here: {err}")
    if inventory.gpus[0].mig_current:
        pytest.skip("GPU 0 has MIG enabled; this test never changes MIG")
    (tmp_path / "sharing.yaml").write_text(CONFIG)
    root = tmp_path / "mps"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(NODEAGENT_MPS_ROOT=str(root), NODEAGENT_MPS_EXCLUSIVE_PROCESS="false")
    common = ["-f", str(tmp_path / "sharing.yaml"), "-c", "embeddings"]
    control = MpsControl(binary, root / "pipe", root / "log")

    def nodeagent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nodeagent", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    try:
        applied = nodeagent("sharing", "apply", *common)
        print(applied.stdout)
        assert applied.returncode == 0, applied.stderr
        assert "ran 0 NVML operations" in applied.stdout and "GPU 0: mps x4" in applied.stdout
        pid = control.daemon_pid()
        assert pid is not None
        assert control.daemon_devices(pid) == [inventory.gpus[0].uuid]  # that GPU only
        assert nodeagent("sharing", "assert", *common).returncode == 0
        labels = json.loads(nodeagent("labels", *common, "-o", "json").stdout)["labels"]
        assert labels["nodeagent.io/gpu.0.sharing"] == "mps"
        assert labels["nodeagent.io/gpu.0.replicas"] == "4"
        client = subprocess.run(
            [sys.executable, "-c", CLIENT], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(root / "pipe"),
                     CUDA_MPS_LOG_DIRECTORY=str(root / "log")),
            check=False,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr[-2000:]
        seen = json.loads(client.stdout.strip().splitlines()[-1])
        print("client:", seen)
        assert seen["sms"] == 32 and seen["under"] == "ok" and seen["over"] == "oom"
    finally:
        stopped = nodeagent("mps", "stop", "--mps-control", binary)
        print(stopped.stdout, stopped.stderr)
    assert control.daemon_pid() is None
