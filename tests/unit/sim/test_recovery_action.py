"""The emulated driver's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), read through
nodeagent's NVML layer as the fault poll reads it; what a GPU reset and a reboot do to it and to
the health a reset restores; `sim health` / `sim xid --recovery-action`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.errors import SimError
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.fields import RECOVERY_ACTION, read_recovery_action
from nodeagent.nvml.health import read_fault_counters
from nodeagent.nvml.session import gpu_handle
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.statefile import load_state
from tests.support.cli import Result, assert_one_error


def action(lib: SimulatedNvml, index: int) -> int | None:
    session = NvmlSession(lib)
    return read_recovery_action(session, gpu_handle(session, index))


def test_the_field_reads_none_until_the_driver_asks_for_an_action() -> None:
    lib = SimulatedNvml(parse_spec("h200x2"))
    assert action(lib, 0) == 0 and action(lib, 1) == 0
    lib.inject_xid(1, 79, recovery_action="node-reboot")
    assert (action(lib, 0), action(lib, 1)) == (0, 2)
    session = NvmlSession(lib)
    assert read_fault_counters(session, gpu_handle(session, 1)).recovery_action == 2


def test_a_reset_answers_a_reset_action_a_reboot_every_action() -> None:
    lib = SimulatedNvml(parse_spec("h200x2"))
    lib.inject_xid(0, 119, recovery_action="gpu-reset")
    lib.inject_xid(1, 79, recovery_action="node-reboot")
    lib.set_health(0, row_remap_pending=1, ecc_uncorrected=2)
    lib.reset(0)
    lib.reset(1)
    assert (action(lib, 0), action(lib, 1)) == (0, 2)
    session = NvmlSession(lib)
    h = read_fault_counters(session, gpu_handle(session, 0))
    assert h.row_remap_pending is False  # the remap was done at the reset
    assert h.ecc_errors == {("uncorrected", "volatile"): 0, ("uncorrected", "aggregate"): 2}
    lib.reboot()
    assert action(lib, 1) == 0


def test_a_driver_without_the_field_answers_not_supported_once() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    lib.set_health(0, recovery_action="unsupported")
    lib.inject_xid(0, 79, recovery_action="node-reboot")  # that driver sets none
    session = NvmlSession(lib)
    unsupported: set[tuple[object, ...]] = set()
    assert read_recovery_action(session, gpu_handle(session, 0), unsupported) is None
    assert unsupported == {("nvmlDeviceGetFieldValues", RECOVERY_ACTION)}
    lib.reboot()  # a reboot does not give an old driver the field
    assert action(lib, 0) is None


def test_the_state_file_keeps_the_action_and_refuses_a_bad_one(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    lib = SimulatedNvml(parse_spec("h200x2"), state)
    lib.set_health(0, recovery_action="drain-and-reset", ecc_corrected=3)
    lib.set_health(1, recovery_action="unsupported")
    lib.reset(0)
    loaded = load_state(state)
    assert loaded is not None
    assert [g.health.recovery_action for g in loaded[0].gpus] == [0, None]
    assert loaded[0].gpus[0].health.ecc_corrected_at_reset == 3
    doc = json.loads(state.read_text())
    doc["gpus"][0]["health"]["recovery_action"] = 99
    state.write_text(json.dumps(doc))
    with pytest.raises(SimError, match="recovery_action"):
        load_state(state)


def test_an_unknown_action_is_refused_and_changes_nothing() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    with pytest.raises(SimError, match="no GPU recovery action"):
        lib.inject_xid(0, 79, recovery_action="reboot")
    with pytest.raises(SimError, match="no GPU recovery action"):
        lib.inject_xid(0, 79, recovery_action="unsupported")
    assert lib.state.gpus[0].health.xid_serial == 0


def test_sim_controls(cli: Callable[..., Result], tmp_path: Path) -> None:
    sim = ("--simulate", "h200", "--sim-state", str(tmp_path / "node.json"))
    res = cli(*sim, "sim", "xid", "--gpu", "0", "--xid", "95", "--recovery-action", "gpu-reset")
    assert res.returncode == 0, res.stderr
    res = cli(*sim, "sim", "health", "--gpu", "0", "--recovery-action", "node-reboot")
    assert res.returncode == 0, res.stderr
    lib = SimulatedNvml(parse_spec("h200"), tmp_path / "node.json")
    assert action(lib, 0) == 2
    assert_one_error(
        cli(*sim, "sim", "health", "--gpu", "0", "--recovery-action", "later"),
        2,
        "'later' is no GPU recovery action",
    )
    assert_one_error(
        cli(*sim, "sim", "xid", "--gpu", "0", "--xid", "79", "--recovery-action", "later"),
        2,
        "'later' is no GPU recovery action",
    )
