"""The fake nvidia-cuda-mps-control written where a test or a benchmark runs it."""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("nvidia-cuda-mps-control")


def control_script(folder: Path) -> Path:
    """`folder`/nvidia-cuda-mps-control (folder made if need be): the fake, started by this
    interpreter without site-packages (`python -IS`: it uses the standard library only, and
    MPS tests run it for every command). Returns its path."""
    _, body = SOURCE.read_text().split("\n", 1)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-cuda-mps-control"
    script.write_text(f"#!{sys.executable} -IS\n{body}")
    script.chmod(0o755)
    return script
