"""`mig assert` and `sharing assert` answer whether the GPUs match, whoever holds a slice: a
held slice makes a change impossible now, not the GPUs a match (exit 1, the differences, never
apply's refusal and its exit 3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result

SHARING = """version: nodeagent/v1
sharing-configs:
  whole:
    - devices: all
      whole: {}
  sliced:
    - devices: all
      mig: {mig-devices: {"1g.18gb": 7}}
"""


@pytest.fixture
def held(cli: Callable[..., Result], tmp_path: Path) -> Callable[..., Result]:
    """A node whose GPU 0 has 7 1g.18gb slices, the first used by pid 4242."""
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    assert cli(*base, "mig", "apply", "-c", "all-1g.18gb").returncode == 0
    slices = cli(*base, "status", "-o", "json")
    assert slices.returncode == 0, slices.stderr
    (tmp_path / "sharing.yaml").write_text(SHARING)
    first = json.loads(slices.stdout)["gpus"][0]["slices"][0]["mig_uuid"]
    assert cli(*base, "sim", "attach", "--device", first, "--pid", "4242").returncode == 0
    return lambda *args: cli(*base, *args)


@pytest.mark.parametrize("config", ["all-disabled", "all-balanced", "all-7g.141gb"])
def test_mig_assert_of_another_config_exits_1(held: Callable[..., Result], config: str) -> None:
    res = held("mig", "assert", "-c", config)
    assert (res.returncode, res.stderr) == (1, "")
    assert res.stdout.startswith("GPU 0: "), res.stdout
    assert "in use" not in res.stdout and "nothing was changed" not in res.stdout


def test_mig_assert_of_the_config_it_has_exits_0(held: Callable[..., Result]) -> None:
    res = held("mig", "assert", "-c", "all-1g.18gb")
    assert (res.returncode, res.stdout) == (0, "config 'all-1g.18gb': the GPUs match\n")


def test_sharing_assert_exits_1_and_apply_still_refuses(
    held: Callable[..., Result], tmp_path: Path
) -> None:
    config = ["-f", str(tmp_path / "sharing.yaml")]
    res = held("sharing", "assert", *config, "-c", "whole")
    assert (res.returncode, res.stderr) == (1, "")
    assert "GPU 0: needs " in res.stdout
    assert held("sharing", "assert", *config, "-c", "sliced").returncode == 0
    refused = held("sharing", "apply", *config, "-c", "whole")
    assert refused.returncode == 3 and "in use by pid 4242" in refused.stderr
    assert held("mig", "assert", "-c", "all-1g.18gb").returncode == 0  # nothing changed
