"""Which nodeagent code one call runs: the read model's test (a scrape runs no owner's code)
and benchmarks/scrape_reach.py profile a collect() with it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nodeagent"


def modules_run(call: Callable[[], object]) -> set[str]:
    """The nodeagent modules (dotted: `nodeagent.metrics.gpus`) whose functions ran during
    `call()`, recorded by sys.setprofile."""
    files: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            files.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return {
        ".".join(Path(f).relative_to(ROOT).with_suffix("").parts)
        for f in files
        if Path(f).is_relative_to(PACKAGE)
    }
