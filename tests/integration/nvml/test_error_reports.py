"""The session tells its listeners the failed calls by function (the agent's snapshot store, which
the metrics read): the counts so far when one starts listening, then after each failure, until it
stops listening."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault

IN_USE = 19  # NVML_ERROR_IN_USE


def test_listeners_are_told_the_counts_after_each_failure() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    lib.faults.faults.append(Fault(function="nvmlDeviceGetCount", error=IN_USE))
    with pytest.raises(NvmlError):
        session.call("nvmlDeviceGetCount")
    told: list[Mapping[str, int]] = []
    stop = session.report_errors(told.append)
    assert told == [{"nvmlDeviceGetCount": 1}]  # what was counted before
    with pytest.raises(NvmlError):
        session.call("nvmlDeviceGetCount")
    assert told[-1] == {"nvmlDeviceGetCount": 2}
    stop()
    with pytest.raises(NvmlError):
        session.call("nvmlDeviceGetCount")
    assert len(told) == 2 and session.error_counts() == {"nvmlDeviceGetCount": 3}
