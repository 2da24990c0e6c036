"""Several `nodeagent` processes changing one emulator state file at once lose no update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cli import _clean_env

CONFIG = """\
version: v1
mig-configs:
  split:
    - devices: [0, 1, 2, 3, 4, 5, 6]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
"""
BATCH = 4  # attach processes started at once, then half of them detached, per round


def _start(state: Path, *args: str) -> subprocess.Popen[bytes]:
    base = [sys.executable, "-m", "nodeagent", "--simulate", "h200x8", "--sim-state", str(state)]
    return subprocess.Popen(
        [*base, *args], env=_clean_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _finish(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()


def test_attach_and_detach_during_an_apply_lose_nothing(tmp_path: Path) -> None:
    """`sim attach/detach` on GPU 7 while `mig apply` splits GPUs 0-6: every slice and every
    attach that was not detached is in the file at the end."""
    state = tmp_path / "node.json"
    config = tmp_path / "mig.yaml"
    config.write_text(CONFIG)
    _finish([_start(state, "status")])
    apply = _start(state, "mig", "apply", "-f", str(config), "-c", "split")
    attached: set[int] = set()
    detached: set[int] = set()
    pid = 1000
    rounds = 0
    while rounds < 2 or apply.poll() is None:
        batch = list(range(pid, pid + BATCH))
        pid += BATCH
        _finish([_start(state, "sim", "attach", "--device", "7", "--pid", str(p)) for p in batch])
        attached.update(batch)
        gone = batch[: BATCH // 2]
        _finish([_start(state, "sim", "detach", "--pid", str(p)) for p in gone])
        detached.update(gone)
        rounds += 1
    _finish([apply])

    data = json.loads(state.read_text())
    assert {p["pid"] for p in data["processes"]} == attached - detached
    slices = [sum(len(gi["cis"]) for gi in gpu["gis"].values()) for gpu in data["gpus"]]
    assert slices == [7] * 7 + [0]
