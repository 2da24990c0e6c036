"""A kubelet's prepare and the ownership record's lock (issue 44 class 1): while another
process holds `.owners.json.lock`, a prepare waits for it no longer than its own deadline,
then is refused as held (reason lock), with no slice made and nothing recorded."""

from __future__ import annotations

import time

import pytest

from nodeagent.base.errors import LockHeld
from nodeagent.dra.claims import ClaimRef
from nodeagent.state.owners import OWNERS_NAME
from tests.integration.cli.test_record_lock import held
from tests.support.dra import DraNode, allocated_claim


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
