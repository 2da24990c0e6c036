"""One MIG writer per node: `mig apply` takes the node-wide lock (beside the emulator's state
file under --simulate); a second writer waits a bounded time, then fails naming the holder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from nodeagent.base.lock import lock_path, mig_writer_lock
from tests.support.cli import Result, assert_one_error


def test_a_held_lock_fails_apply_with_exit_3_naming_the_holder(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    base = ["--simulate", "h200x2", "--sim-state", str(state)]
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*base, "mig", "generate-config").stdout)
    path = lock_path(Path("/unused"), state, simulate=True)
    assert path is not None
    with mig_writer_lock(path, 1):
        res = cli(*base, "mig", "apply", "-f", str(mig), "-c", "all-balanced",
                  "--lock-timeout", "0.2")  # fmt: skip
        assert_one_error(res, 3, "another MIG writer holds", f"pid {os.getpid()}")
        # A dry run only reads: it needs no lock.
        assert cli(*base, "mig", "apply", "-f", str(mig), "-c", "all-balanced",
                   "--dry-run").returncode == 0  # fmt: skip
    assert cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-disabled").returncode == 0
    assert cli(*base, "mig", "apply", "-f", str(mig), "-c", "all-balanced").returncode == 0


def test_two_concurrent_applies_end_in_exactly_one_layout(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*base, "mig", "generate-config").stdout)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nodeagent", *base, "mig", "apply", "-f", str(mig), "-c", name],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("all-balanced", "all-1g.18gb")
    ]
    outcomes = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in outcomes] == [0, 0], outcomes  # the second waited its turn
    matches = [
        cli(*base, "mig", "assert", "-f", str(mig), "-c", name).returncode == 0
        for name in ("all-balanced", "all-1g.18gb")
    ]
    assert matches.count(True) == 1
    status = cli(*base, "status", "-o", "json")
    assert status.returncode == 0
