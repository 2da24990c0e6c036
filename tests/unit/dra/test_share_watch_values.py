"""The share watch reads a client's own limit from its environment as ASCII digits: a value
float() would take ('nan', Arabic-Indic digits, '1e400', spaces) is no limit the MPS client
library reads, so the client is over its share, never within it ('nan' compared as within
every ceiling before)."""

from __future__ import annotations

import pytest

from nodeagent.dra.cdi import CLAIM_ENV
from nodeagent.dra.watch import OVER_THREADS, WITHIN, findings
from nodeagent.state.held import PreparedDevice

SHARE = PreparedDevice(
    "share", "node", "gpu-0-mps", 0, "GPU-0", shared=True,
    mps={"thread_percentage": 20, "sm_limit_percent": 40, "pinned_memory_bytes": None,
         "user": 1000, "priority": "normal"},
)  # fmt: skip


def _look(percent: str) -> str:
    env = {CLAIM_ENV: "uid-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent}
    (found,) = findings([("uid-a", SHARE)], [4242], {4242: None}, lambda _pid: env)
    return found.reason


@pytest.mark.parametrize("percent", ["20", "40", "40.0", "35.5"])
def test_a_client_within_its_limit_is_within(percent: str) -> None:
    assert _look(percent) == WITHIN


@pytest.mark.parametrize("percent", ["41", "100", "nan", "NaN", "٢٠", "1e400", " 20", "-5", "inf"])
def test_a_limit_above_the_claims_or_unreadable_is_over(percent: str) -> None:
    assert _look(percent) == OVER_THREADS
