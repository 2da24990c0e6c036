"""A claim's MPS limits, read once from the record's `mps` entry (nodeagent.mps.claims), and
the referee that keeps the pipeline's daemon and a share server off one GPU
(nodeagent.mps.regimes)."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.errors import MpsError
from nodeagent.mps.claims import ClaimLimits
from nodeagent.mps.regimes import MpsRegimes


@pytest.mark.parametrize(
    ("mps", "limits"),
    [
        # A share as the driver records it now.
        ({"thread_percentage": 20, "pinned_memory_bytes": 8 << 30, "sm_limit_percent": 100,
          "priority": "low", "user": 1000}, ClaimLimits(20, 100, 8 << 30, "low", 1000)),
        # A record of before limits existed: its request stays its ceiling, priority normal.
        ({"thread_percentage": 30, "pinned_memory_bytes": 16 << 30, "pipe_dir": "/p"},
         ClaimLimits(30, 30, 16 << 30, "normal", 0)),
        # An MpsConfig's own daemon: no memory limit.
        ({"thread_percentage": 25, "pinned_memory_bytes": None}, ClaimLimits(25, 25, None)),
    ],
)  # fmt: skip
def test_a_records_mps_entry_reads_as_typed_limits(
    mps: dict[str, Any], limits: ClaimLimits
) -> None:
    got = ClaimLimits.of(mps)
    assert got == limits
    assert got.client("u").thread_percentage == limits.limit_percent  # the server counts limits
    assert got.client_priority == (1 if limits.priority == "low" else 0)


def test_the_pipelines_daemon_and_a_share_server_exclude_each_other_per_gpu() -> None:
    regimes = MpsRegimes()
    regimes.pipeline((0,))
    with pytest.raises(MpsError, match=r"^GPU 0 runs the device-plugin path's MPS daemon"):
        regimes.share(0, "gpu-0-mps-u0")
    regimes.share(1, "gpu-1-mps-u0")  # another GPU: no conflict
    with pytest.raises(MpsError, match=r"^GPU 1 runs the DRA MPS share server gpu-1-mps-u0;"):
        regimes.pipeline((0, 1))
    assert regimes.pipeline_gpus() == {0}  # a refused change takes nothing
    regimes.share_gone("gpu-1-mps-u0")
    regimes.pipeline((0, 1))
    regimes.pipeline(())  # the daemon stopped: every GPU free for share servers
    regimes.share(0, "gpu-0-mps-u0")
