"""Who holds each GPU and MIG slice of the node: one record (nodeagent.state.record), the one
authority for claims, that every path reads before it destroys anything (the reconcile
pipeline, for the node label and the settings; `nodeagent mig apply|sharing apply`; an agent
without `--dra`; the DRA driver, which keeps its claims' states in it and writes its
kubelet-facing checkpoint as a view of it, nodeagent.dra.checkpoint).

A DRA claim owns the whole GPUs and the MIG slices (by GPU and placement) it was prepared with;
`config` names the MIG config the pipeline applied last; every other slice is foreign (made by
hand or by another tool). Nobody but its claim's unprepare destroys a claim's slice.

The record lives beside the node-wide MIG writer lock (`owners.json` in the run directory, or
beside the emulator's state file), so every writer finds the same one whatever its DRA settings
say. Each change is one read-modify-write under the record's own lock (`.owners.json.lock`, an
flock, held for that alone, after the MIG writer lock where both are held), waited for within
the caller's wait (mig.lock-timeout, a claim's deadline) and given up at a stop signal; a
change checks both paths, and takes the lock once, before its first NVML operation. Under the
lock, the temporary files of record writes a kill cut short are swept. A record whose values
break their rules (nodeagent.state.held: a claim UID is a Kubernetes UID, a device carries its
invariants) is not trusted, as one whose seal does not match. When the record
is missing or cannot be read (a checksum that does not match included), it is rebuilt from
what is on the node (`evidence`: the DRA driver's checkpoints, its claims' CDI specs and MPS
roots, the claims the API server allocated here; nodeagent.dra.traces). A source that exists
but cannot be read leaves the rebuilt record `uncertain`: then every GPU and slice counts as
held, and every destroy is refused with one sentence saying why. An uncertain record that is
written keeps saying so, and is rebuilt again at each read until its sources can be read.
Nothing is guessed. A record of before the fold (version 1) has the DRA checkpoints of
before folded into it as it is read (`upgrade`), and is sealed at the next write.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import (
    atomic_write_text,
    interrupted_writes,
    kind_of,
    open_lock_file,
    read_regular,
)
from nodeagent.base.lock import held_lock
from nodeagent.base.logs import get_logger
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.state.held import PreparedClaim
from nodeagent.state.record import CLAIM, VERSION, Owners, holder, parse, untrusted
from nodeagent.state.snapshot import Allocations, Holders

log = get_logger("nodeagent.owners")
OWNERS_NAME = "owners.json"
MAX_FILE_BYTES = 4 << 20  # as every input file the agent reads
DEFAULT_WAIT_SECONDS = 60.0  # for the record's lock, where the caller gives no wait
# A file whose mtime is at least this old when it is read is kept by its identity: any later
# write gives it another mtime, whatever the file system's timestamp granularity (FAT's is
# 2 s; ext4's and tmpfs's a clock tick). A younger one is read again every time (git's "racy"
# entries).
SETTLED_NS = 2_000_000_000
LOCK_WHAT = "the ownership record's lock"
HOLDER_WORDS = "another process holds the ownership record's lock"
__all__ = [
    "CLAIM",
    "OWNERS_NAME",
    "OwnerStore",
    "Owners",
    "PreparedClaim",
    "claimed_mps",
    "holder",
]


def owners_path(lock_path: Path | None) -> Path | None:
    """Beside the MIG writer lock (None: an emulator in one process keeps it in memory)."""
    return None if lock_path is None else lock_path.with_name(OWNERS_NAME)


def _load(path: Path) -> Owners | None:
    """The record at `path`, None when there is none. Raises ConfigError (UnreadableFile
    included) for anything but a regular file holding a record."""
    raw = read_regular(path, "the ownership record", MAX_FILE_BYTES)
    return None if raw is None else parse(raw, path)


# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): a file's identity. A write replaces the
# file (a rename: another inode); an edit in place changes its ctime, which nobody can set.
Identity = tuple[int, int, int, int, int]


def _identity(path: Path) -> Identity | None:
    """The identity of the regular file at `path`; None for anything else (it is read, and
    refused as it should be) or when it cannot be looked at."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class RecordFile:
    """The record's file, parsed again (and its seal checked) only when its identity changed
    since a read that found it settled (`SETTLED_NS`): a reader that looks every tick (the
    share watch) costs a stat while nothing changes."""

    def __init__(self, path: Path, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.path = path
        self.clock_ns = clock_ns
        self._kept: tuple[Identity, Owners] | None = None

    def load(self) -> Owners | None:
        """As `_load`, from the last read where the file is the same one."""
        before = _identity(self.path)
        kept = self._kept
        if before is not None and kept is not None and kept[0] == before:
            return kept[1]
        owners = _load(self.path)
        settled = before is not None and self.clock_ns() - before[3] >= SETTLED_NS
        # kept only when the file read is the one looked at (no write came in between)
        if owners is not None and settled and _identity(self.path) == before:
            assert before is not None
            self._kept = (before, owners)
        return owners


class OwnerStore:
    """The record, read and written by every path. `path` None: kept in memory (an emulator
    in one process). Reads may happen any time (a write is one atomic rename); changes go
    through `update`, one read-modify-write under the record's lock."""

    def __init__(
        self,
        path: Path | None,
        evidence: Callable[[Inventory | None], Owners],
        inventory: Callable[[], Inventory] | None = None,
        upgrade: Callable[[Owners], Owners] | None = None,
    ) -> None:
        self.path = path
        self.evidence = evidence  # rebuilds the record from the node's traces
        self.inventory = inventory
        self.upgrade = upgrade  # folds the records of before into a version-1 record
        self._memory: Owners | None = None
        self._file_read = RecordFile(path) if path is not None else None
        self._listeners: list[Callable[[Owners], None]] = []
        self._lock = threading.Lock()
        self._updating = threading.Lock()  # one read-modify-write at a time in this process
        self._said: tuple[str, tuple[str, ...], str | None] | None = None  # the last warning
        self._swept = False  # this process swept the cut-short writes (at its first write)
        # The wait for the record's lock when the caller gives none (mig.lock-timeout's
        # default); the stop signal that ends a wait at once (0: none).
        self.default_wait: Callable[[], float] = lambda: DEFAULT_WAIT_SECONDS
        self.stopped: Callable[[], int] = lambda: 0

    @property
    def lock_path(self) -> Path | None:
        """The record's lock: `.owners.json.lock` beside it."""
        return None if self.path is None else self.path.with_name(f".{self.path.name}.lock")

    def read(self) -> Owners:
        """The record; rebuilt from the node when missing, unreadable or uncertain (see the
        module). The rebuild reads the GPUs outside every lock of the record."""
        with self._lock:
            found, why, kept = self._file()
        if found is not None:
            return found
        rebuilt = self._rebuilt(why)
        if self.path is None and self._memory is None:
            self._memory = rebuilt  # an emulator in one process: rebuilt once
        return rebuilt if kept is None else _settled(kept, rebuilt)

    def _file(self) -> tuple[Owners | None, str, Owners | None]:
        """The record as written when it can be trusted as it is; else None, why not, and
        the uncertain record written (to be settled against the traces). Never rebuilds."""
        if self.path is None:
            current = self._memory
            if current is None:
                return None, "there is none yet", None
        else:
            assert self._file_read is not None
            try:
                current = self._file_read.load()
            except ConfigError as err:
                return None, str(err), None
            if current is None:
                return None, f"{self.path} does not exist", None
            if current.version == 1 and self.upgrade is not None:
                current = self.upgrade(current)
        if current.uncertain is not None:
            return None, f"{self.path} was written uncertain ({current.uncertain})", current
        return current, "", None

    def ensure(self) -> Owners:
        """Write the record when there is none or it is unreadable (the DRA driver starting,
        before its first claim): rebuilt once from the node, so that claims prepared later are
        never mistaken for a lost record's traces. An uncertain rebuild is not written."""
        owners = self.read()
        if owners.uncertain is None:
            with self._lock:
                current, _why, _kept = self._file()
            if current != owners or (current is not None and current.version == 1):
                self.update(lambda _o: owners)
        return owners

    def _rebuilt(self, why: str) -> Owners:
        inventory = self.inventory() if self.inventory is not None else None
        owners = self.evidence(inventory)
        said = (why, tuple(sorted(owners.claims)), owners.uncertain)
        if (owners.claims or owners.uncertain) and said != self._said:
            # once per finding: a reader that rebuilds at every refresh does not repeat it
            self._said = said
            log.warning("owners.rebuilt", reason=why, claims=list(said[1]), uncertain=said[2])
        return owners

    def check(self, wait_seconds: float | None = None, waited: float = 0.0) -> None:
        """Raise ConfigError when the record could not be written: its path, or its lock's,
        holds anything but a regular file (a folder, a FIFO, a socket, a symbolic link,
        dangling or in a loop), or the lock cannot be opened. With `wait_seconds`, the lock is
        also taken (and let go): LockHeld when another process held it all that time (what it
        says counts `waited`, the seconds the caller's wait spent on the MIG writer lock),
        Interrupted when a stop signal comes meanwhile. Asked before a change's first NVML
        operation, so that a change that would record its owners afterwards is refused with
        nothing changed, not failed with the GPUs changed."""
        if self.path is None:
            return
        self._check_record()
        assert self.lock_path is not None
        try:
            os.close(open_lock_file(self.lock_path, LOCK_WHAT))
        except ConfigError as err:  # it cannot be opened (mode 000 for a user, say)
            raise ConfigError(f"{err}; nothing was changed") from err
        if wait_seconds is not None:
            with self._writing(wait_seconds, waited):
                pass

    def _check_record(self) -> None:
        """Raise ConfigError (nothing was changed) when the record's path or its lock's holds
        anything but a regular file, or cannot be looked at."""
        assert self.path is not None and self.lock_path is not None
        for path, what, remedy in (
            (self.path, "the ownership record", "(the record is rebuilt from the node's claims)"),
            (self.lock_path, LOCK_WHAT, "(it is made again, empty, at the next change)"),
        ):
            try:
                kind = kind_of(os.lstat(path).st_mode)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise ConfigError(
                    f"cannot look at {what} {path}: {err.strerror}; nothing was changed"
                ) from err
            if kind is not None:
                raise ConfigError(
                    f"{what} {path} is {kind}, not a regular file; nothing was changed: move it"
                    f" aside {remedy}"
                )

    def listen(self, listener: Callable[[Owners], None]) -> None:
        """`listener` hears of the record after each write of it in this process, still under
        the record's lock, so its views follow it in order (the DRA checkpoint)."""
        self._listeners.append(listener)

    def update(
        self,
        change: Callable[[Owners], Owners],
        then: Callable[[Owners], None] | None = None,
        wait_seconds: float | None = None,
        waited: float = 0.0,
    ) -> Owners:
        """Read, change, write: one read-modify-write under the record's lock, waited for up
        to `wait_seconds` (default: `self.default_wait()`); the listeners hear of a record
        written, `then` of the record as it stands then (written or not), still under the
        lock. A record that must be rebuilt first is rebuilt outside the lock. Raises
        ConfigError when the file cannot be written, LockHeld when another process held the
        lock all that time, Interrupted when a stop signal comes while waiting, or `change`'s
        error (nothing written)."""
        base: Owners | None = None
        while True:
            with self._writing(wait_seconds, waited):
                with self._lock:
                    found, _why, _kept = self._file()
                found = found if found is not None else base
                if found is not None:
                    owners = change(found)
                    if owners is not found or found.version != VERSION:
                        self._write(owners, found)  # a change that changes nothing writes nothing
                        for listener in self._listeners:
                            listener(owners)
                    if then is not None:
                        then(owners)
                    return owners
            base = self.read()  # the rebuild reads the GPUs: never under the record's lock

    @contextlib.contextmanager
    def _writing(self, wait_seconds: float | None, waited: float = 0.0) -> Iterator[None]:
        """The record's lock, held for one read and one write (after this process's other
        updates: one at a time)."""
        with self._updating:
            if self.path is None or self.lock_path is None:
                yield
                return
            self._check_record()
            wait = self.default_wait() if wait_seconds is None else wait_seconds
            with held_lock(
                self.lock_path,
                LOCK_WHAT,
                HOLDER_WORDS,
                wait,
                stopped=self.stopped,
                waited_before=waited,
            ):
                self._sweep()
                yield

    def _sweep(self) -> None:
        """Remove the temporary files of record writes a kill cut short (readers never see
        them, and nothing else would remove them), once per process, at its first write: a
        cut-short write is a killed process's, swept by the next process that writes (the
        agent restarted, the next one-shot command). Under the record's lock: every write of
        the record holds it, so none of them is a write under way."""
        assert self.path is not None
        if self._swept:
            return
        try:
            for path in interrupted_writes(self.path):
                path.unlink(missing_ok=True)
                log.info("owners.litter_removed", path=str(path))
        except OSError as err:  # litter, not a reason to refuse a change: tried again
            log.warning("owners.litter_left", path=str(err.filename), error=err.strerror)
            return
        self._swept = True

    def _write(self, owners: Owners, since: Owners | None = None) -> None:
        """Replace the record (`since`: as it was read before the change), with nothing its
        reader would refuse: a record that fails its own checks is read as lost (every claim
        in it rebuilt from traces), so a write of one is refused, as this process's bug,
        before the file is touched; the claims the change made are checked. Raises
        ConfigError when the file cannot be written, AgentError for such a record (nothing
        written)."""
        why = untrusted(owners, since if since is not None and since.version == VERSION else None)
        if why is not None:
            raise AgentError(
                f"refusing to write an ownership record that would not be trusted when read:"
                f" {why}; nothing was written (a bug of nodeagent's: please report it)"
            )
        text = owners.to_json()
        with self._lock:
            if self.path is None:
                self._memory = owners
                return
            try:
                atomic_write_text(self.path, text, mode=0o600)
            except OSError as err:
                raise ConfigError(
                    f"cannot write the ownership record {self.path}: {err.strerror}"
                ) from err

    def write(self, owners: Owners) -> None:
        """Replace the record with `owners` (one update)."""
        self.update(lambda _o: owners)


def _settled(kept: Owners, rebuilt: Owners) -> Owners:
    """An uncertain record read again: its own claims (which win) and those the traces show
    now; certain once the traces can all be read."""
    claims = {**rebuilt.claims, **kept.claims}
    return Owners(claims, kept.config, rebuilt.uncertain)


def holders_of(store: OwnerStore, inventory: Callable[[], Inventory]) -> dict[str, Any]:
    """{UUID: Holder} of every claim in the record (read now)."""
    return store.read().holders(inventory())


def inventory_reader(session: NvmlSession) -> Callable[[], Inventory]:
    def read() -> Inventory:
        with session.lock:
            return read_inventory(session)

    return read


@dataclass(frozen=True)
class WithOwners:
    """Who holds each device: `pods` (the kubelet's pod-resources answer; None: no pods
    known) plus the devices the ownership record gives to claims (or every device, when it is
    uncertain). Called, it reads the record; `merged` takes a record already read (a claim's
    change carries the one read when it began)."""

    pods: Allocations | None
    store: OwnerStore
    inventory: Callable[[], Inventory]

    def __call__(self) -> Holders:
        pods = self.pods() if self.pods is not None else {}
        return self.merged(pods, self.store.read(), None)

    def merged(self, pods: Holders, owners: Owners, inventory: Inventory | None) -> Holders:
        """`pods`, and every device `owners` gives to a claim that no pod holds. The GPUs
        (`inventory`, else read now) are needed only where the record lacks a UUID (a slice
        being made) or holds everything (uncertain)."""
        out = dict(pods)
        need = owners.uncertain is not None or any(
            d.is_mig and not d.mig_uuid for c in owners.claims.values() for d in c.devices
        )
        if need and inventory is None:
            inventory = self.inventory()
        for uuid, who in owners.holders(inventory if need else None).items():
            out.setdefault(uuid, who)
        return out


def claimed_mps(store: OwnerStore | None) -> dict[int, str]:
    """{GPU index: the DRA MPS daemon there} as the node's ownership record has the claims
    (Owners.mps_daemons), for the pipeline's MPS step: a daemon another process (an agent's
    DRA driver, a share server that outlived it) runs is known before that process says so.
    Empty without a record."""
    return store.read().mps_daemons() if store is not None else {}
