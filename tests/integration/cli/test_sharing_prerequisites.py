"""`sharing apply` checks every prerequisite of the change before the first mutation: a config
that slices MIG on some GPUs and puts others under MPS, on a node without a usable MPS control
program (or pipe directory, or hooks file, or with the MIG writer lock held), fails with exit 2
(bad input: a setting or the node's setup, nothing changed; exit 3 for the lock, as for
`mig apply`) and one sentence, and the emulated GPUs are exactly as before. Before, the MIG
slices were made and only then the MPS start failed."""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result, assert_one_error

CONFIG = """version: nodeagent/v1
sharing-configs:
  split:
    - devices: [0]
      mig: {mig-devices: {"3g.71gb": 2}}
    - devices: [1]
      mps: {replicas: 4}
"""


def _not_executable(tmp: Path, _fake: str) -> list[str]:
    script = tmp / "mps-control"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    return ["--mps-control", str(script)]


def _pipe_dir_under_a_file(tmp: Path, fake: str) -> list[str]:
    (tmp / "a-file").write_text("")
    return ["--mps-control", fake, "--mps-pipe-dir", str(tmp / "a-file" / "pipe")]


def _bad_hooks(tmp: Path, fake: str) -> list[str]:
    (tmp / "hooks.yaml").write_text("version: v1\nhooks: {apply-begin: []}\n")
    return ["--mps-control", fake, "--hooks-file", str(tmp / "hooks.yaml")]


CASES: dict[str, tuple[Callable[[Path, str], list[str]], int, tuple[str, ...]]] = {
    "control-missing": (
        lambda tmp, _fake: ["--mps-control", str(tmp / "nowhere" / "nvidia-cuda-mps-control")],
        2,
        ("MPS daemon cannot start", "nvidia-cuda-mps-control", "not an executable file"),
    ),
    "control-not-on-path": (
        lambda _tmp, _fake: ["--mps-control", "nodeagent-test-no-such-mps-control"],
        2,
        ("MPS daemon cannot start", "nodeagent-test-no-such-mps-control", "on PATH"),
    ),
    "control-not-executable": (_not_executable, 2, ("mps-control", "not an executable file")),
    "pipe-dir-not-makeable": (_pipe_dir_under_a_file, 2, ("pipe directory", "not a directory")),
    "hooks-file-invalid": (_bad_hooks, 2, ("hooks.yaml:2:9", "unknown hook")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_prerequisite_changes_nothing(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str, case: str
) -> None:
    assert shutil.which("nodeagent-test-no-such-mps-control") is None
    (tmp_path / "sharing.yaml").write_text(CONFIG)
    node = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    assert cli(*node, "mig", "export").returncode == 0
    before = (tmp_path / "node.json").read_bytes()
    make, code, words = CASES[case]
    flags = ["--mps-root", str(tmp_path / "mps"), *make(tmp_path, fake_mps_control)]
    res = cli(
        *node, "sharing", "apply", "-f", str(tmp_path / "sharing.yaml"), "-c", "split", *flags
    )
    assert_one_error(res, code, *words)
    assert (tmp_path / "node.json").read_bytes() == before


def test_the_lock_held_changes_nothing(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str
) -> None:
    (tmp_path / "sharing.yaml").write_text(CONFIG)
    state = tmp_path / "node.json"
    node = ["--simulate", "h200x2", "--sim-state", str(state)]
    assert cli(*node, "mig", "export").returncode == 0
    before = state.read_bytes()
    with open(state.with_name(f".{state.name}.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = cli(*node, "sharing", "apply", "-f", str(tmp_path / "sharing.yaml"), "-c", "split",
                  "--mps-control", fake_mps_control, "--mps-root", str(tmp_path / "mps"),
                  "--lock-timeout", "0")  # fmt: skip
    assert_one_error(res, 3, "lock")
    assert state.read_bytes() == before
