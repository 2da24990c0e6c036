"""The ownership record is read once per look (issue 43): a reader that looks every tick (the
share watch) parses the file again only when it is another file than the one it last read
settled, whatever the file system's mtime granularity: a rewrite in the same mtime tick, of
the same size, is never missed. And the views of the record (the DRA checkpoint) hear of each
write of it, in order, through the listener registered on the store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.base.files import atomic_write_text
from nodeagent.state import owners as owners_module
from nodeagent.state.held import PREPARED, PreparedClaim, PreparedDevice
from nodeagent.state.owners import SETTLED_NS, Owners, OwnerStore, RecordFile

UID_A = "0b7f3c52-5c1e-4b7a-9d11-2a7d3e1f0a01"
UID_B = "0b7f3c52-5c1e-4b7a-9d11-2a7d3e1f0a02"


def _owners(uid: str) -> Owners:
    device = PreparedDevice("r", "pool", "gpu-0", 0, "GPU-0")
    claim = PreparedClaim("speech", "asr", PREPARED, (device,), ("k8s.d/claim=x",), "d")
    return Owners({uid: claim})


def _settle(path: Path, mtime_ns: int) -> None:
    """The file's mtime set back, as a coarse clock (or an old write) leaves it."""
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_settled_record_is_parsed_once_while_it_is_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "owners.json"
    path.write_text(_owners(UID_A).to_json())
    _settle(path, 1_000_000_000)
    parsed: list[Path] = []

    def load(at: Path) -> Owners | None:
        parsed.append(at)
        return original(at)

    original = owners_module._load
    monkeypatch.setattr(owners_module, "_load", load)
    store = OwnerStore(path, lambda _inventory: Owners())

    assert [store.read() for _ in range(3)] == [_owners(UID_A)] * 3
    assert parsed == [path]  # one parse, then a stat a look


def test_a_rewrite_of_the_same_size_in_the_same_mtime_tick_is_seen(tmp_path: Path) -> None:
    """Both ways the record changes: replaced by a rename (another inode), and written in
    place (the ctime moves, which nobody can set back) - each with the same size and the same
    mtime as the file read before."""
    path = tmp_path / "owners.json"
    first, second = _owners(UID_A).to_json(), _owners(UID_B).to_json()
    assert len(first) == len(second)
    path.write_text(first)
    _settle(path, 1_000_000_000)
    reader = RecordFile(path)
    assert reader.load() == _owners(UID_A)

    atomic_write_text(path, second, mode=0o600)  # replaced: a rename
    _settle(path, 1_000_000_000)
    assert reader.load() == _owners(UID_B)

    with path.open("r+") as f:  # in place, same size, same mtime
        f.write(first)
    _settle(path, 1_000_000_000)
    assert reader.load() == _owners(UID_A)


def test_a_record_written_within_the_granularity_is_read_again(tmp_path: Path) -> None:
    """A file younger than SETTLED_NS is never kept: the next write could share its mtime."""
    path = tmp_path / "owners.json"
    path.write_text(_owners(UID_A).to_json())
    now = path.stat().st_mtime_ns
    reader = RecordFile(path, clock_ns=lambda: now + SETTLED_NS - 1)
    assert reader.load() == _owners(UID_A)
    assert reader._kept is None
    with path.open("r+") as f:  # the same size, the same mtime tick, the same inode
        f.write(_owners(UID_B).to_json())
    _settle(path, now)
    assert reader.load() == _owners(UID_B)


def test_the_listeners_hear_of_each_write_in_order(tmp_path: Path) -> None:
    store = OwnerStore(tmp_path / "owners.json", lambda _inventory: Owners())
    heard: list[Owners] = []
    store.listen(heard.append)

    store.write(_owners(UID_A))
    store.update(lambda o: o)  # a change that changes nothing writes nothing: none hears
    store.update(lambda o: o.without(UID_A))

    assert heard == [_owners(UID_A), Owners()]
    assert store.read() == Owners()


def test_cut_short_writes_are_swept_once_per_process_at_its_first_write(
    tmp_path: Path,
) -> None:
    """A write of the record cut short is a killed process's: the next process that writes
    sweeps it, at its first write, under the record's lock (not every write: a folder listing
    per claim's change); a sweep that could not list the folder is tried again."""
    path = tmp_path / "owners.json"
    first = tmp_path / ".owners.json.k3x9_a0b"  # a write killed before its rename
    first.write_text('{"version": 2, "clai')
    store = OwnerStore(path, lambda _inventory: Owners())

    store.update(lambda _o: _owners(UID_A))
    assert not first.exists()  # swept at this process's first write

    later = tmp_path / ".owners.json.zz0011aa"  # as if another process were killed now
    later.write_text('{"version": 2, "clai')
    store.update(lambda _o: _owners(UID_B))
    assert later.exists()  # this process swept already

    OwnerStore(path, lambda _inventory: Owners()).update(lambda o: o)
    assert not later.exists()  # the next process's first write (one that changes nothing)
    assert store.read() == _owners(UID_B)


def test_a_sweep_that_could_not_list_the_folder_is_tried_at_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "owners.json"
    path.write_text(Owners().to_json())  # a record there: one take of the lock per update
    litter = tmp_path / ".owners.json.k3x9_a0b"
    litter.write_text('{"version": 2, "clai')
    listed: list[Path] = []

    def interrupted_writes(at: Path) -> list[Path]:
        listed.append(at)
        if len(listed) == 1:
            raise PermissionError(13, "Permission denied", str(at.parent))
        return original(at)

    original = owners_module.interrupted_writes
    monkeypatch.setattr(owners_module, "interrupted_writes", interrupted_writes)
    store = OwnerStore(path, lambda _inventory: Owners())

    store.update(lambda _o: _owners(UID_A))  # litter left, the change made all the same
    assert litter.exists() and store.read() == _owners(UID_A)
    store.update(lambda _o: _owners(UID_B))
    assert not litter.exists() and len(listed) == 2
    store.update(lambda _o: _owners(UID_A))
    assert len(listed) == 2
