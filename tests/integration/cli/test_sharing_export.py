"""`nodeagent sharing export` round-trips: exporting what a node runs (MIG, an MPS daemon with
its own thread percentage and pinned limits) and applying it back changes nothing, and says so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Result, emulated_mps_node

CONFIG = """version: nodeagent/v1
sharing-configs:
  pinned:
    - devices: [0]
      mig: {mig-devices: {"3g.71gb": 2}}
    - devices: [1, 2]
      mps: {replicas: 4, thread-percentage: 30, pinned-memory: 32G}
    - devices: [3]
      mps: {replicas: 4, thread-percentage: 30, pinned-memory: 20000M}
"""


@pytest.fixture
def node(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str
) -> Iterator[Callable[..., Result]]:
    with emulated_mps_node(tmp_path, fake_mps_control, "h200x4") as (base, mps):
        yield lambda *args: cli(*base, *args[:2], *mps, *args[2:])


def test_export_then_apply_changes_nothing(node: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "pinned.yaml").write_text(CONFIG)
    done = node("sharing", "apply", "-f", str(tmp_path / "pinned.yaml"), "-c", "pinned")
    assert done.returncode == 0, done.stderr
    before = node("mps", "status").stdout
    assert "pinned memory limit, device 0: 32768 MiB" in before
    assert "pinned memory limit, device 2: 20000 MiB" in before

    export = node("sharing", "export")
    assert export.returncode == 0, export.stderr
    entries = yaml.safe_load(export.stdout)["sharing-configs"]["current"]
    mps = {tuple(e["devices"]): e["mps"] for e in entries if "mps" in e}
    assert mps == {
        (1, 2): {"replicas": 3, "thread-percentage": 30, "pinned-memory": "32G"},
        (3,): {"replicas": 3, "thread-percentage": 30, "pinned-memory": "20000M"},
    }
    (tmp_path / "current.yaml").write_text(export.stdout)
    current = ["-f", str(tmp_path / "current.yaml"), "-c", "current"]

    check = node("sharing", "assert", *current)
    assert (check.returncode, check.stdout) == (0, "sharing config 'current': the GPUs match\n")
    again = node("sharing", "apply", *current)
    assert again.returncode == 0, again.stderr
    assert "MPS daemon: runs as the config says, unchanged" in again.stdout
    assert "ran 0 NVML operations; nothing to change" in again.stdout
    assert node("mps", "status").stdout == before  # same daemon, same limits


def test_export_of_a_node_without_mps(node: Callable[..., Result]) -> None:
    export = node("sharing", "export")
    assert export.returncode == 0, export.stderr
    entries = yaml.safe_load(export.stdout)["sharing-configs"]["current"]
    assert entries == [{"devices": [0, 1, 2, 3], "whole": {}}]


def test_apply_in_a_new_process_says_it_changes_the_running_daemons_limits(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    """A second command finds the first one's daemon on the same GPUs with other limits: it
    adopts it and sets its limits, and says so ('limits'), not that it starts one."""
    (tmp_path / "pinned.yaml").write_text(CONFIG)
    assert (
        node("sharing", "apply", "-f", str(tmp_path / "pinned.yaml"), "-c", "pinned").returncode
        == 0
    )
    wider = CONFIG.replace("thread-percentage: 30", "thread-percentage: 50")
    (tmp_path / "wider.yaml").write_text(wider)
    before = node("mps", "status").stdout
    assert "default active thread percentage: 30.0" in before

    done = node("sharing", "apply", "-f", str(tmp_path / "wider.yaml"), "-c", "pinned")

    assert done.returncode == 0, done.stderr
    assert "MPS daemon: limits\n" in done.stdout and "start" not in done.stdout
    after = node("mps", "status").stdout
    assert "default active thread percentage: 50.0" in after
    assert after.splitlines()[0] == before.splitlines()[0]  # the same daemon (its pid)
