"""The record's fields carry their invariants (issue 44 class 2): a recorded claim whose UID is
no Kubernetes UID, a MIG device without its placement, a share's `mps` that is not one, a
prepared claim without one CDI id per device, is not trusted, as a record whose seal does not
match: it is rebuilt from the node's traces, in our words, never with Python's. The DRA
checkpoint read as a trace is held to the same rules."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import entry_of
from nodeagent.base.jsontext import sealed_text
from nodeagent.dra.checkpoint import load
from nodeagent.dra.traces import evidence_of, rebuild
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from nodeagent.state.held import PREPARED, PreparedClaim, PreparedDevice
from nodeagent.state.owners import Owners, OwnerStore
from nodeagent.state.record import parse

SLICE = dataclasses.asdict(
    PreparedDevice("r", "pool", "gpu-0-mig-1g18gb-19-3", 0, "GPU-0", 19, "1g.18gb", 3, 1)
)
SHARE = {
    **dataclasses.asdict(PreparedDevice("r", "pool", "gpu-0-mps", 0, "GPU-0", shared=True)),
    "mps": {"thread_percentage": 25, "pinned_memory_bytes": None, "user": 1000},
}


def _claim(*devices: dict[str, Any], cdi_ids: int | None = None) -> dict[str, Any]:
    count = len(devices) if cdi_ids is None else cdi_ids
    return {"namespace": "speech", "name": "asr", "state": PREPARED, "driver": "d",
            "devices": list(devices), "cdi_ids": [f"k8s.d/claim=u-{i}" for i in range(count)]}  # fmt: skip


def _record(claims: dict[str, Any]) -> bytes:
    payload = {"version": 2, "config": None, "uncertain": None, "claims": claims}
    return sealed_text(payload).encode()


def _with(base: dict[str, Any], /, **changed: Any) -> dict[str, Any]:
    return {**base, **changed}


def _mps(**changed: Any) -> dict[str, Any]:
    return _with(SHARE, mps={**SHARE["mps"], **changed})


GOOD = [
    pytest.param({"uid-1": _claim(SLICE)}, id="slice"),
    pytest.param({"0f6c1a0e-8c3b-4a55-9d1e-2b7f3c9a1d44": _claim(SHARE)}, id="rfc4122-uid"),
    pytest.param({"u": _claim(_mps(pinned_memory_bytes=1 << 30))}, id="pinned-bytes"),
    pytest.param({"u": _claim(_mps(sm_limit_percent=50, priority="low"))}, id="sm-limit"),
    pytest.param({"u": _claim(_mps(sm_limit_percent=25, priority="normal"))}, id="sm-equal"),
    pytest.param({"u": _claim(_mps(pipe_dir="/p/mps/u/gpu-0-mps/pipe"))}, id="pipe-dir"),
]

BAD = [
    ({"../../victim": _claim(SLICE)}, "claim UID '../../victim' is not a Kubernetes UID"),
    ({"a/b": _claim(SLICE)}, "claim UID 'a/b' is not a Kubernetes UID"),
    ({"..": _claim(SLICE)}, "claim UID '..' is not a Kubernetes UID"),
    ({"a\x00b": _claim(SLICE)}, "is not a Kubernetes UID"),
    ({"u\n": _claim(SLICE)}, "is not a Kubernetes UID"),
    ({"u": _claim(_with(SLICE, placement_start=None))}, "has no placement (a start and a size)"),
    ({"u": _claim(_with(SLICE, placement_size=0))}, "has no placement (a start and a size)"),
    ({"u": _claim(_with(SLICE, placement_start=-1))}, "has no placement (a start and a size)"),
    ({"u": _claim(_with(SLICE, device="../../x"))}, "device '../../x' is not a device name"),
    ({"u": _claim(_mps(thread_percentage=0))}, "not a percentage from 1 to 100"),
    ({"u": _claim(_mps(thread_percentage=101))}, "not a percentage from 1 to 100"),
    (
        {"u": _claim(_mps(thread_percentage="25"))},
        "thread_percentage is a string, not a whole number",
    ),
    ({"u": _claim(_mps(thread_percentage=None))}, "its mps has no thread_percentage"),
    ({"u": _claim(_mps(thread_percentage=True))}, "thread_percentage is true or false"),
    ({"u": _claim(_mps(pinned_memory_bytes=-1))}, "pinned_memory_bytes is -1, not bytes"),
    ({"u": _claim(_mps(pinned_memory_bytes="1Gi"))}, "pinned_memory_bytes is a string"),
    ({"u": _claim(_mps(user="root"))}, "user is a string, not a whole number"),
    ({"u": _claim(_mps(user=-1))}, "user is -1, not a uid from 0 to 2147483647"),
    ({"u": _claim(_mps(user=1 << 31))}, "not a uid from 0 to 2147483647"),
    ({"u": _claim(_mps(sm_limit_percent=10))}, "not from thread_percentage (25) to 100"),
    ({"u": _claim(_mps(sm_limit_percent=101))}, "not from thread_percentage (25) to 100"),
    ({"u": _claim(_mps(priority="high"))}, "priority is 'high', not one of normal, low"),
    ({"u": _claim(_mps(extra=1))}, "its mps has an unknown field 'extra'"),
    ({"u": _claim(_with(SHARE, mps=[25]))}, "mps is [25]"),
    ({"u": _claim(SLICE, cdi_ids=0)}, "prepared with 1 devices and 0 CDI ids"),
    ({"u": _claim(SLICE, SLICE, cdi_ids=1)}, "prepared with 2 devices and 1 CDI ids"),
    ({"u": 7}, "claim u is malformed (it is a number, not an object)"),
    ({"u": {**_claim(SLICE), "devices": "gpu-0"}}, "its devices is a string, not a list"),
    ({"u": {**_claim(SLICE), "devices": [7]}}, "its devices[0] is a number, not an object"),
    ({"u": {**_claim(SLICE), "cdi_ids": "x"}}, "its cdi_ids is a string, not a list"),
    ({"u": {k: v for k, v in _claim(SLICE).items() if k != "devices"}}, "it has no devices"),
]
PYTHONS = ("Traceback", "object has no attribute", "not iterable", "KeyError", "object is not")


@pytest.mark.parametrize("claims", GOOD)
def test_a_record_that_keeps_the_invariants_is_read(tmp_path: Path, claims: dict[str, Any]) -> None:
    owners = parse(_record(claims), tmp_path / "owners.json")
    assert set(owners.claims) == set(claims)


@pytest.mark.parametrize(("claims", "words"), BAD, ids=[w for _c, w in BAD])
def test_a_record_that_breaks_one_is_refused_in_our_words(
    tmp_path: Path, claims: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(_record(claims), tmp_path / "owners.json")
    said = str(refused.value)
    assert said.startswith(f"ownership record {tmp_path / 'owners.json'} is unreadable (")
    assert words in said, said
    assert not any(p in said for p in PYTHONS), said


@pytest.mark.parametrize(
    ("claims", "words"), BAD[:3] + BAD[9:12], ids=[w for _c, w in BAD[:3] + BAD[9:12]]
)
def test_a_record_not_trusted_is_rebuilt_from_the_traces(
    tmp_path: Path, claims: dict[str, Any], words: str
) -> None:
    path = tmp_path / "owners.json"
    path.write_bytes(_record(claims))
    store = OwnerStore(path, lambda _inventory: Owners())
    assert store.read().claims == {}  # the traces hold nothing: no recorded claim is trusted


@pytest.mark.parametrize(
    ("claims", "words"),
    [
        ({"u": 7}, "claim u is malformed (it is a number, not an object)"),
        ({"u": {**_claim(SLICE), "devices": "gpu-0"}}, "(its devices is a string, not a list)"),
        ({"../x": _claim(SLICE)}, "claim ../x is malformed (its UID is not a Kubernetes UID)"),
        ({"u": _claim(_mps(thread_percentage=0))}, "not a percentage from 1 to 100"),
    ],
    ids=["claim-number", "devices-string", "uid-climbs", "mps-percentage"],
)
def test_a_checkpoint_read_as_a_trace_is_held_to_the_same_rules(
    tmp_path: Path, claims: dict[str, Any], words: str
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(sealed_text({"version": 2, "claims": claims}))
    with pytest.raises(ConfigError) as refused:
        load(path)
    said = str(refused.value)
    assert words in said and not any(p in said for p in PYTHONS), said
    json.loads(path.read_text())  # untouched


def test_a_trace_named_by_no_kubernetes_uid_is_never_taken_into_the_record(
    tmp_path: Path,
) -> None:
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2")))
    inventory = read_inventory(session)
    gpu = inventory.gpus[1].uuid
    spec = {"devices": [{"name": "gpu-1", "containerEdits": {"env": [
        f"NVIDIA_VISIBLE_DEVICES={gpu}"]}}]}  # fmt: skip
    for uid in ("..", "uid-1"):
        (tmp_path / f"k8s.gpu.nodeagent.io-claim_{uid}.json").write_text(json.dumps(spec))
    owners = rebuild(evidence_of("gpu.nodeagent.io", (), (tmp_path,)), inventory)
    assert set(owners.claims) == {"uid-1"} and owners.uncertain is None


@pytest.mark.parametrize("name", ["..", ".", "", "a/../../b", "a\x00b"])
def test_a_name_that_leaves_its_folder_names_nothing_to_remove(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="is not a name within"):
        entry_of(tmp_path, name, "the claim UID")
    assert entry_of(tmp_path, "uid-1", "the claim UID") == tmp_path / "uid-1"


def test_a_record_its_reader_would_not_trust_is_never_written(tmp_path: Path) -> None:
    """A writer's bug (a prepared claim without its CDI ids) would make the next read lose
    every claim to a rebuild: the write is refused in one sentence, the file kept as it was."""
    store = OwnerStore(tmp_path / "owners.json", lambda _inventory: Owners())
    good = PreparedClaim(
        "speech", "asr", PREPARED, (PreparedDevice(**SLICE),), ("k8s.d/claim=u-0",)
    )
    store.write(Owners({"uid-1": good}))
    before = (tmp_path / "owners.json").read_bytes()
    bad = dataclasses.replace(good, cdi_ids=())

    with pytest.raises(AgentError, match="refusing to write an ownership record that would not"):
        store.update(lambda o: o.with_claim("uid-2", bad))

    assert (tmp_path / "owners.json").read_bytes() == before
    assert store.read().claims == {"uid-1": good}
