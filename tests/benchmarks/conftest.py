"""The voice benchmark's modules (benchmarks/voice/) import each other by plain name, as when
`python benchmarks/voice/run.py` runs: put their folder on the path."""

from __future__ import annotations

import sys
from pathlib import Path

VOICE = Path(__file__).resolve().parents[2] / "benchmarks" / "voice"
if str(VOICE) not in sys.path:
    sys.path.insert(0, str(VOICE))
