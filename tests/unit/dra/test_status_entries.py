"""A claim's status.devices as the driver reports it (nodeagent.dra.status): other drivers'
entries are kept, a Ready condition keeps its lastTransitionTime while its status holds, and
an entry that would not change is not written."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.dra.checkpoint import PreparedDevice
from nodeagent.dra.status import device_data, failed_entries, merged, ready_entries

DRIVER = "gpu.nodeagent.io"
POOL = "node-1"
NOW = "2026-12-04T05:00:00Z"
MIG = PreparedDevice(
    "s", "node-1", "gpu-0-mig-1g18gb-19-3", 0, "GPU-0", profile_id=19, profile="1g.18gb",
    placement_start=3, placement_size=1, mig_uuid="MIG-3",
)  # fmt: skip


def _claim(devices: list[dict[str, Any]] | None = None, share: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "s",
        "driver": DRIVER,
        "pool": "node-1",
        "device": MIG.device,
    }
    if share:
        result["shareID"] = share
    other = {"request": "n", "driver": "net.example.com", "pool": "node-1", "device": "eth1"}
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result, other]}}}
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "c", "generation": 2}, "status": status}


NIC = {"driver": "net.example.com", "pool": "node-1", "device": "eth1", "data": {"ip": "10.0.0.2"}}


def test_ready_entries_name_what_was_made_and_keep_the_other_drivers() -> None:
    claim = _claim([NIC])
    wanted = ready_entries(DRIVER, "node-1", claim, {MIG.device: device_data(MIG)}, "T1")
    devices = merged(claim, DRIVER, wanted)
    assert devices is not None and devices[0] == NIC
    (ours,) = devices[1:]
    assert ours["data"]["uuid"] == "MIG-3" and ours["data"]["mig"]["placement"] == {
        "start": 3,
        "size": 1,
    }
    assert ours["conditions"] == [
        {"type": "Ready", "status": "True", "reason": "Prepared", "observedGeneration": 2,
         "lastTransitionTime": "T1",
         "message": "MIG device MIG-3 (1g.18gb at memory slice 3) made on GPU 0 (GPU-0)"},
    ]  # fmt: skip
    # written again later: nothing changes, nothing to write (the time is the first one's)
    again = ready_entries(DRIVER, "node-1", _claim(devices), {MIG.device: device_data(MIG)}, "T2")
    assert merged(_claim(devices), DRIVER, again) is None
    # removed: the other driver's entry stays
    assert merged(_claim(devices), DRIVER, []) == [NIC]
    assert merged(_claim([NIC]), DRIVER, []) is None


@pytest.mark.parametrize(("status", "since"), [("True", "T2"), ("False", "T1")])
def test_a_condition_moves_its_time_only_when_its_status_changes(status: str, since: str) -> None:
    """Ready False (a failed prepare) at T1, then Ready `status` at T2."""
    failed = merged(_claim(), DRIVER, failed_entries(DRIVER, "node-1", _claim(), "busy", "T1"))
    assert failed is not None and failed[0]["conditions"][0]["message"] == "busy"
    claim = _claim(failed)
    wanted = (
        failed_entries(DRIVER, "node-1", claim, "busier", "T2")
        if status == "False"
        else ready_entries(DRIVER, "node-1", claim, {MIG.device: device_data(MIG)}, "T2")
    )
    (entry,) = merged(claim, DRIVER, wanted) or []
    assert entry["conditions"][0]["status"] == status
    assert entry["conditions"][0]["lastTransitionTime"] == since


def test_an_entry_carries_its_allocation_share_id() -> None:
    claim = _claim(share="a1b2")
    (entry,) = ready_entries(DRIVER, "node-1", claim, {MIG.device: device_data(MIG)}, "T1")
    assert (entry["device"], entry["shareID"]) == (MIG.device, "a1b2")


def _waited(device: str = "gpu-0-mig-1g18gb-19-6") -> dict[str, Any]:
    result = {
        "request": "s", "driver": DRIVER, "pool": POOL, "device": device,
        "bindingConditions": [f"{DRIVER}/SliceReady"],
        "bindingFailureConditions": [f"{DRIVER}/SliceFailed"],
    }  # fmt: skip
    plain = {"request": "g", "driver": DRIVER, "pool": POOL, "device": "gpu-1"}
    return {
        "metadata": {"generation": 1},
        "status": {"allocation": {"devices": {"results": [result, plain]}}},
    }


def test_binding_entries_say_made_or_failed_only_for_the_devices_waited_on() -> None:
    from nodeagent.dra.status import binding_entries, binding_settled

    claim = _waited()
    assert not binding_settled(claim, DRIVER, POOL)
    data = {"type": "mig", "uuid": "MIG-1", "gpu": {"index": 0, "uuid": "GPU-0"}}
    (made,) = binding_entries(DRIVER, POOL, claim, {"gpu-0-mig-1g18gb-19-6": data}, "", NOW)
    assert made["device"] == "gpu-0-mig-1g18gb-19-6" and made["data"] == data
    (cond,) = made["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        f"{DRIVER}/SliceReady",
        "True",
        "SliceMade",
    )
    claim["status"]["devices"] = [made]
    assert binding_settled(claim, DRIVER, POOL)

    (failed,) = binding_entries(DRIVER, POOL, _waited(), None, "GPU 0 is busy", NOW)
    (cond,) = failed["conditions"]
    assert (cond["type"], cond["status"], cond["message"]) == (
        f"{DRIVER}/SliceFailed",
        "True",
        "GPU 0 is busy",
    )
    assert "data" not in failed
    settled_claim = _waited()
    settled_claim["status"]["devices"] = [failed]
    assert binding_settled(settled_claim, DRIVER, POOL)
