"""A kubelet's prepare and the ownership record's lock (issue 44 class 1): while another
process holds `.owners.json.lock`, a prepare waits for it no longer than its own deadline,
then is refused as held (reason lock), with no slice made and nothing recorded."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.base.errors import LockHeld
from nodeagent.dra.claims import ClaimRef
from nodeagent.state.owners import OWNERS_NAME
from tests.integration.cli.test_record_lock import held
from tests.support.agent import make_settings
from tests.support.dra import DraNode, allocated_claim, no_reset, node_config


def test_a_prepare_waits_for_a_held_record_no_longer_than_its_deadline(
    dra_node: DraNode,
) -> None:
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"})
    with held(dra_node.root / f".{OWNERS_NAME}.lock"):
        began = time.monotonic()
        with pytest.raises(LockHeld, match="another process holds the ownership record's lock"):
            dra_node.node.prepare(ClaimRef("speech", "asr", "uid-1"), claim, began + 1.0)
        took = time.monotonic() - began
    assert took < 10, took
    assert dra_node.layout() == []  # no slice made
    assert "uid-1" not in dra_node.node.owners.read().claims


def test_a_claims_two_locks_share_one_lock_timeout(
    dra_node: DraNode, fake_mps_control: str
) -> None:
    """With no deadline (a claim made from the binding watch), a claim's change waits one
    mig.lock-timeout for the MIG writer lock and the record's together, as `mig apply` does:
    the writer lock held 2.5 s, the record's all along, mig.lock-timeout 4 s: refused after
    about 4 s (before: 2.5 s, then the store's own full 4 s more), the sentence counting both
    waits. The engine never recorded the claim, so it made nothing: the refusal's undo has
    nothing to release and does not wait again (before: 4 s more, then `dra.undo_failed`)."""
    settings = make_settings(mig={"lock_timeout_seconds": 4.0})
    root = dra_node.root
    node = dra_driver(
        dra_node.session, settings, node_config(root, fake_mps_control), no_reset,
        root / ".sim.json.lock",
    )  # fmt: skip
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"})
    undone: list[float] = []  # when the refused prepare began an undo
    release = node._release

    def undo(*args: Any, **kwargs: Any) -> None:
        undone.append(time.monotonic())
        release(*args, **kwargs)

    node._release = undo  # type: ignore[method-assign]
    with held(root / f".{OWNERS_NAME}.lock"):
        with held(root / ".sim.json.lock"):
            refused: list[BaseException] = []

            def prepare() -> None:
                try:
                    node.prepare(ClaimRef("speech", "asr", "uid-1"), claim)
                except LockHeld as err:
                    refused.append(err)

            worker = threading.Thread(target=prepare)
            began = time.monotonic()
            worker.start()
            time.sleep(2.5)  # then the MIG writer lock is let go
        worker.join(timeout=30)
        took = time.monotonic() - began
    assert [type(e) for e in refused] == [LockHeld]
    assert undone == []  # nothing recorded, nothing made: nothing to undo
    assert "another process holds the ownership record's lock" in str(refused[0])
    assert "gave up after 4 s" in str(refused[0]), refused[0]
    assert 3.5 < took < 5.5, took  # one 4 s wait; before, 2.5 s + 4 s, and 4 s more to undo
    assert dra_node.layout() == []
    assert "uid-1" not in node.owners.read().claims
