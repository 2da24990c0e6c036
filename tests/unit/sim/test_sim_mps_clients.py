"""Emulated MPS clients: `attach(..., mps_client=True)` is kept in the state file, so another
process of the same emulated node (`nodeagent metrics`, the agent) lists it among the MPS clients;
a state file whose `mps_client` is no boolean is refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.base.errors import SimError
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.statefile import load_state

MIB = 1 << 20


def _mps_pids(lib: SimulatedNvml) -> list[int]:
    lib.nvmlInit()
    handle = lib.nvmlDeviceGetHandleByIndex(0)
    return [int(p.pid) for p in lib.nvmlDeviceGetMPSComputeRunningProcesses(handle)]


def test_an_mps_client_is_kept_in_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    lib = SimulatedNvml(parse_spec("h100-80gb"), state)
    lib.attach("0", 10, MIB)
    lib.attach("0", 11, MIB, mps_client=True)
    again = SimulatedNvml(parse_spec("h100-80gb"), state)
    assert _mps_pids(again) == [11]
    loaded = load_state(state)
    assert loaded is not None
    assert [(p.pid, p.mps_client) for p in loaded[0].processes] == [(10, False), (11, True)]


def test_a_state_file_with_a_wrong_mps_client_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    SimulatedNvml(parse_spec("h100-80gb"), state).attach("0", 11, MIB, mps_client=True)
    data = json.loads(state.read_text())
    data["processes"][0]["mps_client"] = "yes"
    state.write_text(json.dumps(data))
    with pytest.raises(SimError, match=r"processes\[0\]\.mps_client must be true or false"):
        load_state(state)
