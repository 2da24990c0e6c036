"""Values from the ownership record never steer a path (issue 44 class 2): a record holding a
claim whose UID is `../../victim` (sealed, or of version 1) is not trusted, so the binder's
release at start removes nothing outside the plugin directory; the record is rebuilt from the
node's traces, as one whose seal does not match."""

from __future__ import annotations

import json

import pytest

from nodeagent.base.jsontext import sealed_text
from nodeagent.dra.k8s.binding import Binder
from nodeagent.state.owners import OWNERS_NAME
from tests.support.dra import DRIVER, DraNode

CLAIM = {"namespace": "x", "name": "y", "state": "preparing", "devices": [], "cdi_ids": [],
         "driver": DRIVER}  # fmt: skip


def _record(version: int, uid: str) -> str:
    if version == 1:
        return json.dumps({"version": 1, "config": None, "claims": {uid: {"namespace": "x",
                           "name": "y", "devices": []}}})  # fmt: skip
    return sealed_text({"version": 2, "config": None, "uncertain": None, "claims": {uid: CLAIM}})


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("uid", ["../../victim", "a/../../../victim", ".."])
def test_a_recorded_uid_that_climbs_out_removes_nothing(
    dra_node: DraNode, version: int, uid: str
) -> None:
    victim = dra_node.root / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    (dra_node.root / "p" / "mps").mkdir(parents=True, exist_ok=True)
    (dra_node.root / OWNERS_NAME).write_text(_record(version, uid))
    reports = dra_node.server.v1.reports
    binder = Binder(reports.api, dra_node.node, reports)

    binder.cycle()  # the binder's pass at start: the claims recorded, not allocated, released

    assert (victim / "keep").read_text() == "mine"
    assert (dra_node.root / "p").is_dir()
    assert uid not in dra_node.node.owners.read().claims


SHARE = {"request": "r", "pool": "node-1", "device": "gpu-0-mps", "gpu": 0, "gpu_uuid": "GPU-0",
         "shared": True, "mps": {"thread_percentage": 25, "pinned_memory_bytes": None}}  # fmt: skip


@pytest.mark.parametrize(
    "mps",
    [{"thread_percentage": "abc"}, {"pinned_memory_bytes": None}, {"thread_percentage": 25,
     "user": "root"}, {"thread_percentage": 25, "pinned_memory_bytes": "1Gi"}],
    ids=["percentage-text", "no-percentage", "user-text", "bytes-text"],
)  # fmt: skip
def test_the_share_watch_reads_a_garbled_share_as_no_record(
    dra_node: DraNode, mps: dict[str, object]
) -> None:
    claim = {**CLAIM, "state": "prepared", "devices": [{**SHARE, "mps": mps}],
             "cdi_ids": ["k8s.gpu.nodeagent.io/claim=u-gpu-0-mps"]}  # fmt: skip
    payload = {"version": 2, "config": None, "uncertain": None, "claims": {"u": claim}}
    (dra_node.root / OWNERS_NAME).write_text(sealed_text(payload))

    assert dra_node.node.check_shares() == []  # the share watch's pass, every 2 s
    assert "u" not in dra_node.node.owners.read().claims
