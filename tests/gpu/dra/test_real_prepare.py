"""The DRA driver's node side on the real GPU (NVIDIA's NVML, the real nvidia-cuda-mps-control):
a whole-GPU claim and an MPS share are prepared and unprepared through the one pipeline, the MPS
share's limits read back from the real daemon, nothing left behind, and no NVML write made (MIG
stays as it is: this card's MIG mode is never changed)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.base.errors import MpsError
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeConfig, NodeDriver
from nodeagent.mig.apply import Done
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import Inventory, NvmlSession
from nodeagent.reconcile.claims import ChangeDone, ClaimChange
from nodeagent.settings import Settings

pytestmark = pytest.mark.gpu
DRIVER = "gpu.nodeagent.io"


class Recording:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.operations: list[Done] = []

    def run_change(self, change: ClaimChange) -> ChangeDone:
        done: ChangeDone = self.engine.run_change(change)
        self.operations += done.operations
        return done


@pytest.fixture
def node(
    session: NvmlSession, real_inventory: Inventory
) -> Iterator[tuple[NodeDriver, Recording, Path]]:
    if real_inventory.gpus[0].mig_current:
        pytest.skip("GPU 0 has MIG on: a whole-GPU claim would need it off (never changed here)")
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("no nvidia-cuda-mps-control here")
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    config = NodeConfig(DRIVER, "gpu-node", root / "p", root / "cdi", mps_control=control)
    driver = dra_driver(session, Settings(), config, lambda i: None, root / ".mig.lock")
    recording = Recording(driver.engine)
    driver.engine = recording
    try:
        yield driver, recording, root
    finally:
        for d in (root / "p" / "mps").glob("*/*"):  # never leave a daemon behind a failure
            if (d / "pipe" / "control").exists():
                with contextlib.suppress(MpsError):
                    MpsControl(control, d / "pipe", d / "log").command("quit")
        shutil.rmtree(root, ignore_errors=True)


def _claim(uid: str, device: str, mps: dict[str, Any] | None = None) -> dict[str, Any]:
    config = []
    if mps is not None:
        params = {"apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsConfig", **mps}
        config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
    results = [{"request": "r", "driver": DRIVER, "pool": "gpu-node", "device": device}]
    return {
        "metadata": {"name": uid, "namespace": "gpu", "uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }


def test_a_whole_gpu_and_an_mps_share_on_the_real_gpu(
    node: tuple[NodeDriver, Recording, Path], real_inventory: Inventory
) -> None:
    driver, recording, root = node
    gpu = real_inventory.gpus[0]
    whole = driver.prepare(ClaimRef("gpu", "whole", "whole"), _claim("whole", "gpu-0"))
    assert whole[0].cdi_ids == ("k8s.gpu.nodeagent.io/claim=whole-gpu-0",)
    spec = json.loads(next((root / "cdi").glob("*whole*")).read_text())
    assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in spec["devices"][0]["containerEdits"]["env"]
    driver.unprepare("whole")

    share = _claim("share", "gpu-0", {"threadPercentage": 25, "pinnedMemory": "16Gi"})
    driver.prepare(ClaimRef("gpu", "share", "share"), share)
    daemon = driver.mps_root("share", "gpu-0")
    control = MpsControl(driver.config.mps_control, daemon / "pipe", daemon / "log")
    assert control.daemon_pid() is not None
    assert control.command("get_default_active_thread_percentage").startswith("25")
    driver.unprepare("share")
    assert not (root / "p" / "mps" / "share").exists()
    assert not list((root / "cdi").glob("*"))
    assert recording.operations == []  # no NVML write on this card
