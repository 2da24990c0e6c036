"""The fault log: the faults that wait for a GPU reset or a node reboot (`faults.json`, beside
the MIG writer lock), so that an agent restarted on the same boot keeps them; a log of another
boot (the node rebooted since: /proc/sys/kernel/random/boot_id changed) is dropped, as a
reboot recovers every GPU. ("The record" is the ownership record, nodeagent.state.owners.)

A log that cannot be read (not JSON, another shape, a folder, a link loop) is set aside with
one warning: the agent starts without its faults rather than not at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent.base.errors import AgentError
from nodeagent.base.files import atomic_write_text, read_regular
from nodeagent.base.jsontext import NotJson, parse_json
from nodeagent.base.logs import get_logger
from nodeagent.base.units import is_digits

log = get_logger("nodeagent.state.faults")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
RECORD_NAME = "faults.json"
VERSION = 1
MAX_RECORD_BYTES = 1 << 20
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Waiting:
    """One fault of a whole GPU that waits for `waits_for` (reset or reboot): its kind and the
    wall time it was first seen."""

    gpu: int
    kind: str
    since: float
    waits_for: str


def read_boot_id(path: Path = BOOT_ID) -> str | None:
    """This boot's id (the kernel's random boot_id), None where it cannot be read."""
    try:
        data = read_regular(path, "the kernel's boot id", 4096)
    except AgentError:
        return None
    text = None if data is None else data.decode("ascii", "replace").strip()
    return text or None


def faultlog_path(lock_path: Path | None) -> Path | None:
    """Beside the MIG writer lock (None: an emulator in one process keeps it in memory)."""
    return None if lock_path is None else lock_path.with_name(RECORD_NAME)


class FaultLog:
    """Reads and writes the fault log at `path`; `boot_id` reads this boot's id (injected by
    tests)."""

    def __init__(self, path: Path, boot_id: Callable[[], str | None] = read_boot_id) -> None:
        self.path = path
        self.boot_id = boot_id
        self._failed = False
        self.stale = False  # the last load found a log it did not use

    def load(self) -> list[Waiting]:
        """The faults of this boot's log; none when there is none, it is of another boot
        (or the boot id cannot be read), or it cannot be read (one warning)."""
        boot = self.boot_id()
        self.stale = True
        try:
            data = read_regular(self.path, "fault log", MAX_RECORD_BYTES)
        except AgentError as err:
            log.warning("faults.log_unreadable", path=str(self.path), error=str(err))
            return []
        if data is None:
            self.stale = False
            return []
        try:
            found, recorded_boot = _parse(data)
        except (NotJson, ValueError, TypeError):
            log.warning(
                "faults.log_unreadable",
                path=str(self.path),
                error="not a version 1 fault log; its faults are dropped",
            )
            return []
        if boot is None or recorded_boot != boot:
            if found:
                log.info("faults.log_of_another_boot", path=str(self.path), faults=len(found))
            return []
        self.stale = False
        return found

    def save(self, waiting: Sequence[Waiting]) -> None:
        """Write `waiting` as this boot's log; a failure is logged once (the faults stay
        in memory)."""
        text = json.dumps(
            {
                "version": VERSION,
                "boot_id": self.boot_id(),
                "faults": [asdict(w) for w in waiting[:MAX_ENTRIES]],
            },
            indent=1,
            sort_keys=True,
        )
        try:
            atomic_write_text(self.path, text + "\n", 0o644, what="fault log")
        except (OSError, AgentError) as err:
            if not self._failed:
                log.warning("faults.log_not_written", path=str(self.path), error=str(err))
            self._failed = True
            return
        self._failed = False


def _parse(data: bytes) -> tuple[list[Waiting], str | None]:
    raw = parse_json(data)  # the one reader of the agent's own files: never RecursionError
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise ValueError("not a version 1 fault log")
    boot = raw.get("boot_id")
    entries = raw.get("faults")
    if (boot is not None and not isinstance(boot, str)) or not isinstance(entries, list):
        raise ValueError("bad fault log")
    return [_entry(e) for e in entries[:MAX_ENTRIES]], boot


def _entry(e: object) -> Waiting:
    if not isinstance(e, dict):
        raise ValueError("bad entry")
    kind, waits, since = e.get("kind"), e.get("waits_for"), e.get("since")
    code = kind[4:] if isinstance(kind, str) and kind.startswith("xid-") else ""
    if not is_digits(code, 10):
        raise ValueError("bad kind")
    if waits not in ("reset", "reboot"):
        raise ValueError("bad wait")
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not 0 <= since < 1e12:
        raise ValueError("bad time")
    gpu = e.get("gpu")
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < 1024:
        raise ValueError("bad GPU")
    return Waiting(gpu=gpu, kind=str(kind), since=float(since), waits_for=str(waits))
