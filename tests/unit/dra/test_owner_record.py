"""The ownership record's file (nodeagent.state.owners) and its rebuild from the DRA driver's
traces on the node (nodeagent.dra.traces)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.dra.traces import AllocatedClaim, evidence_of, rebuild
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from nodeagent.state.held import PREPARING, PreparedClaim
from nodeagent.state.owners import Owners, OwnerStore
from tests.support.records import held, owned

DRIVER = "gpu.nodeagent.io"


def _node() -> NvmlSession:
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2")))
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    gi = writer.create_gpu_instance(0, 19, Placement(3, 1))
    writer.create_compute_instance(0, gi, 1, 0, full=True)
    return session


def test_a_written_record_reads_back_equal(tmp_path: Path) -> None:
    store = OwnerStore(tmp_path / "owners.json", evidence_of(DRIVER, (), ()))
    owners = Owners({"u": owned("ns", "c", (held("GPU-1"), held("GPU-2", 3, 1, 19)))}, "x")
    store.write(owners)
    assert store.read() == owners


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 2, "claims": {}}',
        '{"version": 1, "claims": {"u": {"namespace": 1, "name": "c", "devices": []}}}',
        '{"version": 1, "claims": {"u": {"namespace": "n", "name": "c", "devices": [{"gpu_uuid": "G", "start": true}]}}}',
        '{"version": 1, "claims": {"u": {"namespace": "n", "name": "c", "devices": [{"bogus": 1}]}}}',
        '{"version": 1, "claims": []}',
        "[]",
    ],
)
def test_a_malformed_record_is_rebuilt_not_trusted(tmp_path: Path, text: str) -> None:
    (tmp_path / "owners.json").write_text(text)
    api = {"u2": AllocatedClaim("speech", "asr", ("gpu-1",))}
    session = _node()
    store = OwnerStore(
        tmp_path / "owners.json",
        evidence_of(DRIVER, (), (), lambda: api),
        lambda: read_inventory(session),
    )
    owners = store.read()
    assert owners.uncertain is None
    assert set(owners.claims) == {"u2"}


def test_the_api_claims_hold_their_devices_made_or_not() -> None:
    session = _node()
    inventory = read_inventory(session)
    api = {
        "u1": AllocatedClaim("speech", "asr", ("gpu-0-mig-1g18gb-19-3",)),
        "u2": AllocatedClaim("speech", "tts", ("gpu-0-mig-1g18gb-19-5",)),  # not made yet
        "u3": AllocatedClaim("llm", "big", ("gpu-1",)),
        "u4": AllocatedClaim("x", "other", ("a-device-of-another-driver",)),
    }
    owners = rebuild(evidence_of(DRIVER, (), (), lambda: api), inventory)
    (slice_,) = inventory.gpus[0].slices
    held = {uuid: str(h) for uuid, h in owners.holders(inventory).items()}
    assert held == {
        slice_.mig_uuid: "claim speech/asr",
        inventory.gpus[1].uuid: "claim llm/big",
    }
    assert owners.owner_of(inventory.gpus[0].uuid, 5, 1) == "claim speech/tts"
    assert set(owners.claims) == {"u1", "u2", "u3"}


def test_an_api_that_cannot_answer_makes_the_record_uncertain() -> None:
    session = _node()
    inventory = read_inventory(session)

    def down() -> dict[str, AllocatedClaim]:
        raise KubeError("connection refused")

    owners = rebuild(evidence_of(DRIVER, (), (), down), inventory)
    assert owners.uncertain is not None and "connection refused" in owners.uncertain
    held = owners.holders(inventory)
    # Every GPU and slice is held: every destroy is refused, naming why.
    assert set(held) == {g.uuid for g in inventory.gpus} | {
        s.mig_uuid for s in inventory.gpus[0].slices
    }
    assert "an unknown owner (cannot list the claims" in str(next(iter(held.values())))


def test_a_record_in_memory_is_kept_between_reads() -> None:
    store = OwnerStore(None, evidence_of(DRIVER, (), ()))
    store.update(lambda o: o.with_claim("u", owned("n", "c", (held("GPU-1"),))))
    assert set(store.read().claims) == {"u"}
    store.update(lambda o: o.without("u"))
    assert store.read().claims == {}


def test_a_fifo_as_record_or_trace_never_hangs_the_reader(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "owners.json")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    os.mkfifo(cdi / "k8s.gpu.nodeagent.io-claim_u1.json")
    store = OwnerStore(tmp_path / "owners.json", evidence_of(DRIVER, (), (cdi,)))
    owners = store.read()  # a blocking open of either FIFO would hang here
    assert owners.uncertain is not None and "a FIFO, not a file" in owners.uncertain


def test_an_uncertain_record_keeps_its_claims_and_says_so_until_its_traces_read(
    tmp_path: Path,
) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = cdi / "k8s.gpu.nodeagent.io-claim_u1.json"
    spec.write_text("{half a spec")
    store = OwnerStore(tmp_path / "owners.json", evidence_of(DRIVER, (), (cdi,)))
    claim = PreparedClaim("n", "c", PREPARING, (held("GPU-1"),))

    store.update(lambda o: o.with_claim("u2", claim))  # written, uncertain as it is

    owners = store.read()
    assert owners.uncertain is not None and "is unreadable" in owners.uncertain
    assert owners.claims["u2"] == claim
    spec.unlink()  # the trace fixed: the record is certain again, its claim kept
    owners = store.read()
    assert owners.uncertain is None and owners.claims == {"u2": claim}
