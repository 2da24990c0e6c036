"""Which devices are faulty, and when they are healthy again (nodeagent.state.faults), on a
virtual clock."""

from __future__ import annotations

import pytest

from nodeagent.nvml.health import Health
from nodeagent.state.faults import Fault, FaultKey, FaultPolicy, FaultTracker, fatal
from tests.support.clock import ManualClock

GPU0, GPU1 = FaultKey(0), FaultKey(1)
SLICE = FaultKey(0, 19, 3)  # 1g.18gb at memory slice 3
POLICY = FaultPolicy(hold_seconds=30.0)


def tracker() -> tuple[FaultTracker, ManualClock]:
    clock = ManualClock()
    return FaultTracker(clock, wall=lambda: 1_000_000.0 + clock()), clock


def ecc(count: int) -> Health:
    return Health(ecc_errors={("uncorrected", "volatile"): count, ("corrected", "volatile"): 0})


def test_an_xid_holds_its_fault_until_hold_seconds_without_a_new_one() -> None:
    t, clock = tracker()
    t.xid(SLICE, 94)  # a contained ECC error: restart the application (NVIDIA's Xid catalog)
    assert t.active(POLICY) == {SLICE: Fault(("xid-94",), 1_000_000.0 + clock())}
    since = t.active(POLICY)[SLICE].since
    clock.advance(20)
    t.xid(SLICE, 94)  # again: the hold starts over, the fault keeps its first time
    clock.advance(20)
    assert t.active(POLICY)[SLICE].since == since
    clock.advance(10)
    assert t.active(POLICY) == {}  # 30 s without one: healthy again


def test_application_xids_are_no_fault_and_the_policy_names_them() -> None:
    t, _ = tracker()
    t.xid(GPU0, 13)
    t.xid(GPU1, 31)
    assert t.active(POLICY) == {}
    assert set(t.active(FaultPolicy(30.0, frozenset()))) == {GPU0, GPU1}


def test_an_ecc_count_going_up_is_a_fault_its_first_read_only_a_baseline() -> None:
    t, clock = tracker()
    t.health(GPU0, ecc(5))  # errors from before the agent started: not news
    t.health(GPU0, ecc(5))
    assert t.active(POLICY) == {}
    t.health(GPU0, ecc(6))
    assert t.active(POLICY)[GPU0].kinds == ("ecc-uncorrected",)
    clock.advance(29)
    t.health(GPU0, ecc(6))  # stable: the hold runs out
    assert GPU0 in t.active(POLICY)
    clock.advance(1)
    assert t.active(POLICY) == {}
    t.health(GPU0, ecc(0))  # the driver reloaded: a new baseline, no fault
    assert t.active(POLICY) == {}


@pytest.mark.parametrize(
    ("pending", "failure", "kinds"),
    [
        (True, False, ("row-remap-pending",)),
        (False, True, ("row-remap-failure",)),
        (True, True, ("row-remap-failure", "row-remap-pending")),
    ],
)
def test_row_remap_faults_last_while_nvml_says_so(
    pending: bool, failure: bool, kinds: tuple[str, ...]
) -> None:
    t, clock = tracker()
    t.health(GPU1, Health(row_remap_pending=pending, row_remap_failure=failure))
    clock.advance(3600)  # no hold: as long as the flag
    assert t.active(POLICY)[GPU1].kinds == kinds
    t.health(GPU1, Health(row_remap_pending=False, row_remap_failure=False))
    assert t.active(POLICY) == {}


def test_several_kinds_on_one_device_date_from_the_oldest() -> None:
    t, clock = tracker()
    t.xid(GPU0, 48)
    first = t.active(POLICY)[GPU0].since
    clock.advance(5)
    t.health(GPU0, ecc(1))
    t.health(GPU0, ecc(2))
    assert t.active(POLICY)[GPU0] == Fault(("ecc-uncorrected", "xid-48"), first)


def test_a_destroyed_slice_is_forgotten() -> None:
    t, _ = tracker()
    t.xid(SLICE, 94)
    t.xid(GPU1, 94)
    t.forget({GPU0, GPU1})
    assert set(t.active(POLICY)) == {GPU1}


@pytest.mark.parametrize(
    ("kinds", "named", "is_fatal"),
    [
        (("xid-79",), (), False),
        (("xid-79",), ("xid",), True),
        (("xid-79",), ("xid-48",), False),
        (("xid-48", "xid-79"), ("xid-48",), True),
        (("ecc-uncorrected",), ("ecc-uncorrected",), True),
        (("row-remap-pending",), ("xid", "row-remap-failure"), False),
        (("recovery-gpu-reset",), ("recovery",), True),
        (("recovery-node-reboot",), ("recovery-gpu-reset",), False),
        (("recovery-node-reboot",), ("recovery-node-reboot",), True),
        (("recovery-9",), ("recovery",), True),
        (("recovery-gpu-reset",), ("xid",), False),
    ],
)
def test_fatal_by_kind_or_every_xid(
    kinds: tuple[str, ...], named: tuple[str, ...], is_fatal: bool
) -> None:
    assert fatal(kinds, named) is is_fatal


def test_the_settings_accept_every_recovery_action_the_driver_names() -> None:
    """dra.fatal-faults takes each kind a recovery action's fault has (the settings floor keeps
    its own list of the names: this keeps the two the same)."""
    from nodeagent.settings.parsers import RECOVERY_ACTIONS, faults
    from nodeagent.state.recovery import ACTION_NAMES, action_kind

    assert ("none", *RECOVERY_ACTIONS) == ACTION_NAMES
    kinds = [action_kind(a) for a in range(1, 9)]  # 8: one this nodeagent does not know
    assert faults(",".join(["recovery", *kinds])) == ("recovery", *kinds)
