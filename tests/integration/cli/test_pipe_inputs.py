"""`-f <(generate)`, as a shell hands it: the MIG config, the sharing config and the workload
file may come from a pipe (read once, bounded), for one-shot commands and the agent alike."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_plan_agent import MIG_ONLY
from tests.support.cli import bash


def test_process_substitution_feeds_every_config_flag(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(MIG_ONLY)
    proc = bash(
        "$NODEAGENT mig apply -f <($NODEAGENT mig generate-config) -c all-1g.18gb -o json\n"
        "$NODEAGENT mig assert -f <($NODEAGENT mig generate-config) -c all-1g.18gb\n"
        "$NODEAGENT plan -f <(cat w.yaml) -o yaml > planned.yaml\n"
        "$NODEAGENT sharing apply -f <(cat planned.yaml) -c planned\n",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout.split("\n}\n")[0] + "}")["operations"]) == 15
    assert "config 'all-1g.18gb': the GPUs match" in proc.stdout
