"""Fixtures of the GPU tests: the real NVML session, and a CUDA load (a torch matmul loop
holding 4 GiB more) in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import Inventory, NvmlSession, load_real_library, open_session, read_inventory

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
keep = torch.empty(4 * 1024**3, dtype=torch.uint8, device="cuda")  # 4 GiB more in use
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


@pytest.fixture(scope="module")
def session() -> NvmlSession:
    try:
        return open_session(load_real_library())
    except NvmlError as err:
        pytest.skip(f"no NVML here: {err}")


@pytest.fixture(scope="module")
def real_inventory(session: NvmlSession) -> Inventory:
    return read_inventory(session)


@pytest.fixture
def load() -> Iterator[subprocess.Popen[str]]:
    """The load, running for up to 20 s, 2 s after it started computing."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", LOAD, "20"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(2.0)
    yield proc
    proc.kill()
    proc.wait()
