"""The DRA driver's node side in a process of its own, on the emulator's state file (the GPUs
keep theirs as the driver's files keep theirs), killed where a test says: at an NVML mutation
(the emulator's NODEAGENT_SIM_FAULTS) or just before the rename of a written file (the
temporary file written and fsynced, not renamed), as SIGKILL would (exit 137)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from pathlib import Path
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeConfig
from nodeagent.nvml import NvmlSession
from nodeagent.agent.factory import dra_driver
from nodeagent.settings import Settings
from nodeagent.sim import open_emulator

root, action, claim = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
kill = json.loads(sys.argv[4])  # {"write": N} or {"at": path}: killed before that rename
pool, gpus = sys.argv[5], sys.argv[6]  # the node's name, the emulated GPUs
if kill:
    import os
    real_replace, writes = os.replace, [0]

    def replace(src, dst, *args, **kwargs):
        writes[0] += 1
        if writes[0] == kill.get("write") or str(dst) == kill.get("at"):
            (root / "killed-at").write_text(str(dst))
            os._exit(137)  # as SIGKILL: the temporary file is written, not renamed
        real_replace(src, dst, *args, **kwargs)

    os.replace = replace
control = sys.argv[7] if len(sys.argv) > 7 else "nvidia-cuda-mps-control"  # MPS claims'
config = NodeConfig("gpu.nodeagent.io", pool, root / "p", root / "cdi", mps_control=control)
session = NvmlSession(open_emulator(gpus, root / "sim.json"))
node = dra_driver(session, Settings(), config, lambda i: None, root / ".sim.json.lock")
meta = claim["metadata"]
if action == "prepare":
    node.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)
elif action == "make":  # the binding watcher's half, before the pod binds
    node.make(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)
else:
    node.unprepare(meta["uid"])
"""


def run(
    root: Path,
    action: str,
    claim: dict[str, Any],
    fault: dict[str, Any] | None,
    kill: dict[str, Any] | None = None,
    pool: str = "node-1",
    gpus: str = "h200x2",
    mps_control: str = "nvidia-cuda-mps-control",
) -> int:
    """The driver of node `pool` in a process of its own; `fault`: an NVML fault of the
    emulator's; `kill`: {"write": N} or {"at": path}, the process ends before that rename of
    a written file; `mps_control`: the MPS control program its MPS claims use."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    if fault is not None:
        env["NODEAGENT_SIM_FAULTS"] = json.dumps([fault])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), action, json.dumps(claim), json.dumps(kill),
         pool, gpus, mps_control],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode in (0, 137), proc.stderr
    return proc.returncode
