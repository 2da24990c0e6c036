"""XID faults by recovery action (nodeagent.state.faults, .recovery, .faultlog): an XID after
which the GPU needs a reset or the node a reboot keeps its fault past dra.health-hold until the
recovery ran; the driver's recovery action decides where it reports one, NVIDIA's Xid catalog
where it does not. On a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.nvml.health import Health
from nodeagent.state.faultlog import FaultLog, read_boot_id
from nodeagent.state.faults import FaultKey, FaultPolicy, FaultTracker
from nodeagent.state.recovery import (
    ACTION_NAMES,
    BUCKETS,
    HOLD,
    REBOOT,
    RESET,
    action_value,
    xid_buckets,
    xid_waits_for,
    xids_waiting_for,
)
from tests.support.clock import ManualClock

GPU0, GPU1 = FaultKey(0), FaultKey(1)
SLICE = FaultKey(0, 19, 3)
HOLD_SECONDS = 30.0
POLICY = FaultPolicy(hold_seconds=HOLD_SECONDS)
NONE, GPU_RESET, NODE_REBOOT = 0, 1, 2  # nvmlDeviceGpuRecoveryAction_t
WALL = 1_000_000.0


def tracker(faultlog: FaultLog | None = None) -> tuple[FaultTracker, ManualClock]:
    clock = ManualClock()
    return FaultTracker(clock, wall=lambda: WALL + clock(), faultlog=faultlog), clock


def past_hold(t: FaultTracker, clock: ManualClock) -> dict[FaultKey, tuple[str, ...]]:
    clock.advance(HOLD_SECONDS + 1)
    return {k: f.kinds for k, f in t.active(POLICY).items()}


def action(value: int) -> Health:
    return Health(recovery_action=value)


# -- the catalog, where the driver reports no recovery action --------------------------------


@pytest.mark.parametrize(
    ("xid", "waits_for"),
    [
        (48, RESET),  # double-bit ECC error
        (64, RESET),  # row remap failure
        (74, RESET),  # NVLink error
        (79, REBOOT),  # fallen off the bus
        (95, RESET),  # uncontained ECC error
        (119, RESET),  # GSP RPC timeout
        (120, RESET),  # GSP error
        (160, REBOOT),  # channel retirement
        (94, HOLD),  # contained ECC error: restart the application
        (63, HOLD),  # a row remap recorded: row-remap-pending holds the GPU until its reset
        (31, HOLD),  # an application's page fault
        (154, HOLD),  # the recovery action changed: the field says what
        (999, HOLD),  # a code the catalog does not list
    ],
)
def test_the_catalog_says_what_each_xid_waits_for(xid: int, waits_for: str) -> None:
    assert xid_waits_for(xid) == waits_for


def test_the_table_is_data_from_the_catalog_with_buckets_the_code_knows() -> None:
    buckets = xid_buckets()
    assert set(range(1, 163)) <= set(buckets)  # every code of the catalog up to Xid 162
    holds = {
        "RESTART_APP", "IGNORE", "UNEXPECTED_ERR_REPORT_ISSUE", "CHECK_MECHANICALS",
        "UPDATE_SWFW", "WORKFLOW_XID_45", "CHECK_UVM", "SEE_RECOVERY_ACTION",
    }  # fmt: skip
    # A bucket a new table brings must be placed on purpose: in BUCKETS or here.
    assert set(buckets.values()) <= holds | set(BUCKETS)
    assert xids_waiting_for(REBOOT) == (79, 151, 160)


@pytest.mark.parametrize("xid", [48, 95, 119])
def test_a_reset_class_xid_stays_past_the_hold_until_the_gpu_is_reset(xid: int) -> None:
    t, clock = tracker()
    t.health(GPU0, Health())  # a driver without the field
    t.xid(GPU0, xid)
    assert past_hold(t, clock) == {GPU0: (f"xid-{xid}",)}
    assert past_hold(t, clock) == {GPU0: (f"xid-{xid}",)}  # and an hour later too
    clock.advance(3600)
    assert GPU0 in t.active(POLICY)


def test_a_pending_row_remap_done_is_the_sign_of_a_reset() -> None:
    t, clock = tracker()
    t.health(GPU0, Health(row_remap_pending=True))
    t.xid(GPU0, 48)
    t.xid(GPU0, 94)  # a hold-class one beside it
    assert past_hold(t, clock) == {GPU0: ("row-remap-pending", "xid-48")}
    t.health(GPU0, Health(row_remap_pending=False))  # the reset activated the remap
    assert t.active(POLICY) == {}


def test_a_volatile_ecc_counter_restarting_is_the_sign_of_a_reset() -> None:
    t, clock = tracker()
    t.health(GPU1, Health(ecc_errors={("uncorrected", "volatile"): 3}))
    t.xid(GPU1, 95)
    assert past_hold(t, clock) == {GPU1: ("xid-95",)}
    t.health(GPU1, Health(ecc_errors={("uncorrected", "volatile"): 0}))
    assert t.active(POLICY) == {}


def test_a_reset_before_the_xid_does_not_clear_it() -> None:
    t, clock = tracker()
    t.health(GPU0, Health(row_remap_pending=True))
    t.health(GPU0, Health(row_remap_pending=False))
    t.xid(GPU0, 119)
    assert past_hold(t, clock) == {GPU0: ("xid-119",)}


def test_a_reboot_class_xid_outlasts_a_gpu_reset() -> None:
    t, clock = tracker()
    t.health(GPU0, Health(row_remap_pending=True))
    t.xid(GPU0, 79)
    t.health(GPU0, Health(row_remap_pending=False))
    assert past_hold(t, clock) == {GPU0: ("xid-79",)}


def test_a_reset_class_xid_of_a_slice_is_the_whole_gpus() -> None:
    t, clock = tracker()
    t.xid(SLICE, 95)
    t.xid(SLICE, 94)  # contained: the slice's own
    assert {k: f.kinds for k, f in t.active(POLICY).items()} == {
        GPU0: ("xid-95",),
        SLICE: ("xid-94",),
    }
    t.forget({GPU0})  # the slice destroyed: the GPU still waits for its reset
    assert past_hold(t, clock) == {GPU0: ("xid-95",)}


# -- the driver's recovery action ------------------------------------------------------------


def test_the_drivers_recovery_action_holds_the_fault_until_it_reads_none() -> None:
    t, clock = tracker()
    t.xid(GPU0, 94)  # a hold-class XID by the catalog
    t.health(GPU0, action(GPU_RESET))  # but the driver asks for a reset
    assert t.active(POLICY)[GPU0].kinds == ("recovery-gpu-reset", "xid-94")
    assert past_hold(t, clock) == {GPU0: ("recovery-gpu-reset", "xid-94")}
    t.health(GPU0, action(NONE))  # the GPU was reset
    assert t.active(POLICY) == {}


def test_where_the_driver_reads_none_after_the_xid_the_hold_is_all() -> None:
    t, clock = tracker()
    t.xid(GPU1, 79)
    t.health(GPU1, action(NONE))
    assert t.active(POLICY)[GPU1].kinds == ("xid-79",)
    assert past_hold(t, clock) == {}


def test_a_read_from_before_the_xid_does_not_speak_for_it() -> None:
    """A GPU that fell off the bus answers no more reads: the catalog decides."""
    t, clock = tracker()
    t.health(GPU0, action(NONE))
    t.xid(GPU0, 79)
    assert past_hold(t, clock) == {GPU0: ("xid-79",)}


def test_node_reboot_names_its_action_and_a_slice_read_is_not_the_gpus() -> None:
    t, clock = tracker()
    t.xid(GPU0, 79)
    t.health(SLICE, action(NONE))  # a MIG device does not answer for its GPU
    t.health(GPU0, action(NODE_REBOOT))
    assert past_hold(t, clock) == {GPU0: ("recovery-node-reboot", "xid-79")}
    t.health(GPU0, action(7))  # SYSTEM_REBOOT
    assert t.active(POLICY)[GPU0].kinds == ("recovery-system-reboot", "xid-79")
    t.health(GPU0, action(42))  # a value of a newer driver
    assert t.active(POLICY)[GPU0].kinds == ("recovery-42", "xid-79")


def test_action_names() -> None:
    assert ACTION_NAMES[:5] == ("none", "gpu-reset", "node-reboot", "drain-p2p", "drain-and-reset")
    assert [action_value(n) for n in ACTION_NAMES] == list(range(len(ACTION_NAMES)))
    assert action_value("reboot") is None


# -- across agent restarts: the record and the boot id --------------------------------------


def test_a_restart_on_the_same_boot_keeps_what_waits_a_reboot_drops_it(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    t, clock = tracker(FaultLog(path, boot_id=lambda: "boot-a"))
    t.xid(GPU0, 79)
    t.xid(GPU1, 48)
    t.xid(GPU1, 94)  # hold-class: not recorded
    t.active(POLICY)
    again, clock = tracker(FaultLog(path, boot_id=lambda: "boot-a"))  # the agent restarted
    assert past_hold(again, clock) == {GPU0: ("xid-79",), GPU1: ("xid-48",)}
    assert again.active(POLICY)[GPU0].since == WALL  # when it was first seen
    rebooted, clock = tracker(FaultLog(path, boot_id=lambda: "boot-b"))
    assert rebooted.active(POLICY) == {}
    assert json.loads(path.read_text())["faults"] == []  # and the record says so


def test_a_recovery_clears_the_fault_log(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    t, clock = tracker(FaultLog(path, boot_id=lambda: "boot-a"))
    t.health(GPU0, Health(row_remap_pending=True))
    t.xid(GPU0, 64)
    assert [f["kind"] for f in json.loads(path.read_text())["faults"]] == ["xid-64"]
    t.health(GPU0, Health(row_remap_pending=False))
    assert past_hold(t, clock) == {}
    assert json.loads(path.read_text())["faults"] == []


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"version": 2, "boot_id": "boot-a", "faults": []}',
        '{"version": 1, "boot_id": "boot-a", "faults": "xid-79"}',
        '{"version": 1, "boot_id": "boot-a", "faults": [{"gpu": "0"}]}',
        '{"version": 1, "boot_id": "boot-a", "faults": [{"gpu": 0, "kind": "xid-79",'
        ' "since": 1, "waits_for": "forever"}]}',
        "[" * 100_000,
        "\udcff",
    ],
)
def test_a_fault_log_it_cannot_read_is_set_aside(tmp_path: Path, text: str) -> None:
    path = tmp_path / "faults.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    t, _ = tracker(FaultLog(path, boot_id=lambda: "boot-a"))
    assert t.active(POLICY) == {}
    t.xid(GPU0, 79)  # and the next fault writes a good one
    assert json.loads(path.read_text())["faults"][0]["kind"] == "xid-79"


def test_a_fault_log_that_is_a_folder_neither_stops_the_agent(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.mkdir()
    t, _ = tracker(FaultLog(path, boot_id=lambda: "boot-a"))
    t.xid(GPU0, 79)  # the write fails: logged, the fault stays in memory
    assert t.active(POLICY)[GPU0].kinds == ("xid-79",)


def test_without_a_boot_id_nothing_is_restored(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    t, _ = tracker(FaultLog(path, boot_id=lambda: None))
    t.xid(GPU0, 79)
    again, _ = tracker(FaultLog(path, boot_id=lambda: None))
    assert again.active(POLICY) == {}


def test_the_boot_id_is_the_kernels(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("0f6b4e1c-4d39-4c34-9a55-0b9f1d0c2e77\n")
    assert read_boot_id(boot) == "0f6b4e1c-4d39-4c34-9a55-0b9f1d0c2e77"
    assert read_boot_id(tmp_path / "absent") is None
    assert read_boot_id(tmp_path) is None  # a folder


def test_the_docs_list_the_xids_the_table_holds() -> None:
    root = Path(__file__).parents[3]
    for page in ("docs/dra.md", "docs/metrics.md"):
        text = " ".join((root / page).read_text().split())
        for what, codes in ((RESET, xids_waiting_for(RESET)), (REBOOT, xids_waiting_for(REBOOT))):
            listed = ", ".join(str(c) for c in codes if not 145 <= c <= 150).replace(
                "144", "144-150"
            )
            if page.endswith("metrics.md"):
                head, _, last = listed.rpartition(", ")
                listed = f"{head} and {last}"
            assert listed in text, f"{page} does not list the XIDs that wait for a {what}: {listed}"
