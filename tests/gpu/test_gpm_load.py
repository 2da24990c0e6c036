"""GPM and memory on a real GPU under a CUDA load (torch matmul loop), then idle. Read-only."""

from __future__ import annotations

import subprocess
import time

import pytest

from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.gpm import GpmReader

pytestmark = pytest.mark.gpu


def _gpm(reader: GpmReader, index: int, window: float = 0.5) -> dict[str, float]:
    first = reader.sample(index)
    time.sleep(window)
    second = reader.sample(index)
    try:
        return reader.ratios(first, second)
    finally:
        reader.free(first)
        reader.free(second)


def test_gpm_and_memory_follow_a_cuda_load(
    session: NvmlSession, load: subprocess.Popen[str]
) -> None:
    reader = GpmReader(session)
    gpu = read_inventory(session).gpus[0]
    if gpu.mig_current or not reader.supported(0):
        pytest.skip("GPU 0 has MIG enabled or no GPM")
    busy = _gpm(reader, 0)
    used_busy = read_inventory(session).gpus[0].memory_used_bytes
    pids = [p.pid for p in read_inventory(session).gpus[0].processes]
    print(f"under load: {busy}, memory used {used_busy / 2**30:.2f} GiB, pids {pids}")
    assert busy["sm_active"] > 0.5
    assert busy["tensor_active"] > 0.3
    assert load.pid in pids
    load.kill()
    load.wait()
    time.sleep(1.5)
    idle = _gpm(reader, 0)
    used_idle = read_inventory(session).gpus[0].memory_used_bytes
    print(f"idle: {idle}, memory used {used_idle / 2**30:.2f} GiB")
    assert idle["sm_active"] < 0.1
    assert used_busy - used_idle > 4 * 2**30
