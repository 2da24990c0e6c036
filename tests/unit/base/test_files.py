"""What a write cut short by a kill leaves (nodeagent.base.files.interrupted_writes): the
temporary file of that target only, found after the process died between its write and its
rename."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nodeagent.base.files import atomic_write_text, interrupted_writes

REPO = Path(__file__).resolve().parents[3]
KILLED_BEFORE_RENAME = """
import os, sys
from pathlib import Path
from nodeagent.base.files import atomic_write_text
os.replace = lambda src, dst: os._exit(137)
atomic_write_text(Path(sys.argv[1]), "half done")
"""


def test_the_temporary_file_of_a_killed_write_is_found_for_its_target_only(
    tmp_path: Path,
) -> None:
    target = tmp_path / "k8s.gpu.nodeagent.io-claim_uid-1.json"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_RENAME, str(target)], cwd=REPO, timeout=60
    )
    assert proc.returncode == 137
    (left,) = interrupted_writes(target)
    assert left.read_text() == "half done" and not target.exists()

    atomic_write_text(target, "whole")  # the target itself, another claim's, an editor's
    (tmp_path / ".k8s.gpu.nodeagent.io-claim_uid-10.json.abcd1234").write_text("")
    (tmp_path / ".k8s.gpu.nodeagent.io-claim_uid-1.json.swp").write_text("")
    assert interrupted_writes(target) == [left]
    assert interrupted_writes(tmp_path / "none" / "x.json") == []  # no folder: none
