"""The emulator's counters are as wide as NVML's and behave as the hardware's at the top:
energy (mJ, unsigned 64-bit) wraps to 0, ECC counts (64-bit) and PCIe replays (32-bit)
stop at their largest value. Whatever the emulator writes, its state loader takes back."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.health import U32_MAX, U64_MAX, energy_mj
from nodeagent.sim.healthcalls import MAX_COUNT
from nodeagent.sim.statefile import load_state

COUNTERS = {"ecc_corrected": U64_MAX, "ecc_uncorrected": U64_MAX, "pcie_replays": U32_MAX}


def _at(state: Path, **health: int) -> SimulatedNvml:
    """An emulator whose state file holds GPU 0's counters at `health`."""
    SimulatedNvml(parse_spec("h200"), state).set_health(0, ecc_corrected=0)
    doc = json.loads(state.read_text())
    doc["gpus"][0]["health"].update(health)
    state.write_text(json.dumps(doc))
    return SimulatedNvml(parse_spec("h200"), state)


@pytest.mark.parametrize(("key", "most"), COUNTERS.items())
def test_an_error_counter_at_its_top_stays_there_and_loads(
    tmp_path: Path, key: str, most: int
) -> None:
    state = tmp_path / "node.json"
    lib = _at(state, **{key: most - 1})
    lib.set_health(0, **{key: 5})
    loaded = load_state(state)
    assert loaded is not None and getattr(loaded[0].gpus[0].health, key) == most
    lib.set_health(0, **{key: 1})  # at the top: stays
    again = load_state(state)
    assert again is not None and getattr(again[0].gpus[0].health, key) == most


def test_energy_wraps_to_zero_past_64_bits_and_loads(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    lib = _at(state, energy_mj=U64_MAX, energy_at=time.time())
    gpu = lib.state.gpus[0]
    later = gpu.health.energy_at + 1.0  # one second at 75 W idle: 75,000 mJ
    assert energy_mj(gpu, 0.0, later) == 75_000 - 1
    lib.health_clock = lambda: later
    lib.set_health(0, ecc_corrected=0)  # folds the energy into the state file
    loaded = load_state(state)
    assert loaded is not None and loaded[0].gpus[0].health.energy_mj == 75_000 - 1


def test_the_xid_serial_at_its_top_loads(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    lib = _at(state, xid_serial=U64_MAX)
    lib.inject_xid(0, 79)
    loaded = load_state(state)
    assert loaded is not None and loaded[0].gpus[0].health.xid_serial == U64_MAX


@settings(max_examples=25, deadline=None)
@given(
    start=st.integers(0, U64_MAX),
    more=st.lists(st.integers(0, MAX_COUNT), min_size=1, max_size=4),
    key=st.sampled_from(sorted(COUNTERS)),
)
def test_every_counter_the_emulator_writes_loads_back(
    tmp_path_factory: pytest.TempPathFactory, start: int, more: list[int], key: str
) -> None:
    state = tmp_path_factory.mktemp("c") / "node.json"
    lib = _at(state, **{key: min(start, COUNTERS[key])})
    for count in more:
        lib.set_health(0, **{key: count})
    loaded = load_state(state)
    assert loaded is not None
    assert getattr(loaded[0].gpus[0].health, key) == min(
        min(start, COUNTERS[key]) + sum(more), COUNTERS[key]
    )
