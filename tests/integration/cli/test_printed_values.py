"""Values read from files and records (a claim's name in the ownership record, a pod's name)
are printed with their control characters escaped: one error is one line, and no value can
forge a second `nodeagent:` line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.state.held import PreparedClaim, on_gpu
from nodeagent.state.record import Owners
from tests.support.cli import Result, assert_one_error

FORGED = "asr\nnodeagent: config 'all-disabled': the GPUs already match; nothing to change"


@pytest.mark.parametrize("namespace, name", [("speech", FORGED), (FORGED, "asr")])
def test_a_claim_name_cannot_forge_a_line(
    cli: Callable[..., Result], tmp_path: Path, namespace: str, name: str
) -> None:
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    assert cli(*base, "mig", "apply", "-c", "all-1g.18gb").returncode == 0
    gpu = json.loads(cli(*base, "status", "-o", "json").stdout)["gpus"][0]
    first = gpu["slices"][0]
    device = on_gpu(0, gpu["uuid"], (first["placement"]["start"], 1, 19), first["mig_uuid"])
    claim = PreparedClaim(namespace, name, "prepared", (device,), ("nodeagent.io/claim=uid-1-0",))
    (tmp_path / "owners.json").write_text(Owners({"uid-1": claim}).to_json())

    refused = cli(*base, "mig", "apply", "-c", "all-disabled")

    assert_one_error(refused, 3)  # one line: the name's newline shown as \n
    assert "nothing to change" not in refused.stdout
