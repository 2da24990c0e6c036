"""The `nodeagent status` sample in docs/getting-started.md is a real run's output: made again
here on the emulator, line for line."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import REPO, Result

MIG = """version: v1
mig-configs:
  sample:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}
    - devices: [1]
      mig-enabled: false
"""


def test_the_status_sample_is_what_status_prints(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    page = (REPO / "docs" / "getting-started.md").read_text()
    match = re.search(
        r"```\n\$ nodeagent (--simulate h200x2 --sim-state \S+) status\n(.*?)```", page, re.S
    )
    assert match is not None
    (tmp_path / "mig.yaml").write_text(MIG)
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "node.json")]
    assert (
        cli(*base, "mig", "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "sample").returncode == 0
    )
    slices = json.loads(cli(*base, "status", "-o", "json").stdout)["gpus"][0]["slices"]
    big = next(s["mig_uuid"] for s in slices if s["profile"] == "3g.71gb")
    assert (
        cli(
            *base, "sim", "attach", "--device", big, "--pid", "4242", "--memory-mib", "10240"
        ).returncode
        == 0
    )
    assert (
        cli(
            *base, "sim", "attach", "--device", "1", "--pid", "4343", "--memory-mib", "20480"
        ).returncode
        == 0
    )
    res = cli(*base, "status")
    assert res.returncode == 0, res.stderr
    assert res.stdout == match.group(2)
