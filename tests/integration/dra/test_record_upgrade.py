"""A node running the records of before (issue 37 item 2) upgrades in place: the ownership
record and the DRA checkpoint of version 1 (unsealed; the record's devices by `start` and
`size`), written by the code at f1c8b3e for two prepared claims (tests/fixtures/records-v1:
a 1g.18gb slice at placement 3 of GPU 0, the whole GPU 1, their CDI specs and the emulator's
state), are read as they were, trusted as they were, and sealed at the next write, with
nothing destroyed and nothing forgotten. A sealed record or checkpoint changed by hand is not
trusted."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.checkpoint import PREPARED, load
from nodeagent.dra.claims import ClaimRef
from nodeagent.state.owners import OWNERS_NAME
from tests.integration.dra.test_crash import driver, layout
from tests.integration.dra.test_held_by_commands import _apply
from tests.support.cli import REPO, Result, assert_one_error
from tests.support.dra import allocated_claim

Cli = Callable[..., Result]
TODAY = REPO / "tests" / "fixtures" / "records-v1"
ASR = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"})
TTS = allocated_claim("tts", "uid-2", {"gpu": "gpu-1"})


def _node_of_before(root: Path) -> None:
    (root / "p").mkdir()
    (root / "cdi").mkdir()
    shutil.copy(TODAY / "sim.json", root / "sim.json")
    shutil.copy(TODAY / "checkpoint.json", root / "p" / "checkpoint.json")
    shutil.copy(TODAY / OWNERS_NAME, root / OWNERS_NAME)
    for spec in TODAY.glob("k8s.*.json"):
        shutil.copy(spec, root / "cdi" / spec.name)


def _version(path: Path) -> int:
    data = json.loads(path.read_text())
    assert isinstance(data["version"], int)
    return data["version"]


def test_the_records_of_before_are_read_trusted_and_sealed_at_the_next_write(
    short_root: Path, cli: Cli
) -> None:
    _node_of_before(short_root)
    record, checkpoint = short_root / OWNERS_NAME, short_root / "p" / "checkpoint.json"

    # The version-1 record still holds the claim's slice against every other path.
    refused = _apply(cli, short_root, short_root / "sim.json")
    assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")

    node = driver(short_root)
    try:
        node.start()  # both files sealed, the checkpoints of before folded into the record
        assert _version(record) == 2 and _version(checkpoint) == 2
        before = load(TODAY / "checkpoint.json").claims  # nothing forgotten
        assert load(checkpoint).claims == {
            uid: dataclasses.replace(c, driver="gpu.nodeagent.io") for uid, c in before.items()
        }
        # A prepared claim of before is answered from its checkpoint, nothing made again.
        (answer,) = node.prepare(ClaimRef("speech", "asr", "uid-1"), ASR)
        assert answer.cdi_ids == ("k8s.gpu.nodeagent.io/claim=uid-1-gpu-0-mig-1g18gb-19-3",)
        assert layout(short_root) == (True, [("1g.18gb", 3, True)])

        node.unprepare("uid-2")  # the next write: both records sealed, uid-1 kept whole
        assert _version(record) == 2 and _version(checkpoint) == 2
        kept = load(checkpoint).claims["uid-1"]
        assert kept.state == PREPARED and kept.devices[0].gi_id == 10
        assert kept.devices[0].mig_uuid == "MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757"
        text = record.read_text()
        assert '"uid-1"' in text and '"uid-2"' not in text and '"placement_start": 3' in text
        assert layout(short_root) == (True, [("1g.18gb", 3, True)])
        refused = _apply(cli, short_root, short_root / "sim.json")
        assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")

        node.unprepare("uid-1")  # made by the claim: its unprepare destroys it
    finally:
        node.session.close()
    assert layout(short_root) == (True, [])
    assert load(checkpoint).claims == {} and '"uid-1"' not in record.read_text()


def test_a_checkpoint_changed_by_hand_is_not_trusted_and_the_record_decides(
    short_root: Path,
) -> None:
    _node_of_before(short_root)
    checkpoint = short_root / "p" / "checkpoint.json"
    node = driver(short_root)
    try:
        node.unprepare("uid-2")  # sealed now
        checkpoint.write_text(checkpoint.read_text().replace('"gi_id": 10', '"gi_id": 11'))
        with pytest.raises(ConfigError, match="its checksum does not match its content"):
            load(checkpoint)
        problem = node.problem()  # /readyz says so
        assert problem is not None and "is not trusted" in problem, problem
        # The driver decides from the ownership record, and writes its view again from it.
        node.unprepare("uid-1")
        assert node.problem() is None and load(checkpoint).claims == {}
    finally:
        node.session.close()
    assert layout(short_root) == (True, [])  # the claim's own slice, by the record's ids


def test_a_sealed_record_changed_by_hand_is_rebuilt_not_trusted(short_root: Path, cli: Cli) -> None:
    _node_of_before(short_root)
    record = short_root / OWNERS_NAME
    node = driver(short_root)
    try:
        node.unprepare("uid-2")  # sealed now
    finally:
        node.session.close()
    # Emptied by hand, its checksum kept: the claim is not given up, the traces hold it.
    data = json.loads(record.read_text())
    data["claims"] = {}
    record.write_text(json.dumps(data))

    refused = _apply(cli, short_root, short_root / "sim.json")

    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 3 and "is in use by claim speech/asr" in last, refused.stderr
    assert "its checksum does not match its content" in refused.stderr  # the rebuild's warning
    assert layout(short_root) == (True, [("1g.18gb", 3, True)])
