"""Who owns each GPU and MIG slice of the node: one record that every path reads before it
destroys anything (the reconcile pipeline, for the node label and the settings; `nodeagent mig
apply|sharing apply`; the DRA driver).

    {"version": 2, "checksum": "sha256:..", "config": "all-balanced",
     "claims": {"<uid>": {"namespace": "speech", "name": "asr-0",
                          "devices": [{"device": "gpu-0-mig-1g18gb-19-3", "gpu": 0,
                                       "gpu_uuid": "GPU-..", "placement_start": 3,
                                       "placement_size": 1, "profile_id": 19,
                                       "mig_uuid": "MIG-..", ...}]}}}

The devices are the one device type of every record (nodeagent.state.held.PreparedDevice, as
the DRA checkpoint has them). The record is sealed with a checksum; one that does not match
it is not trusted (it is rebuilt, as an unreadable one). A version-1 record (unsealed, its
devices by `start` and `size` only) is read as it was written and sealed at the next write.

A DRA claim owns the whole GPUs and the MIG slices (by GPU and placement) it was prepared with;
`config` names the MIG config the pipeline applied last; every other slice is foreign (made by
hand or by another tool). Nobody but its claim's unprepare destroys a claim's slice.

The record lives beside the node-wide MIG writer lock (`owners.json` in the run directory, or
beside the emulator's state file), so every writer finds the same one whatever its DRA settings
say, and it is written only under that lock. When it is missing or cannot be read, it is
rebuilt from what is on the node (`evidence`: the DRA driver's checkpoints, its claims' CDI
specs and MPS roots, the claims the API server allocated here; nodeagent.dra.traces). A
source that exists but cannot be read leaves the rebuilt record `uncertain`: then every GPU
and slice counts as held, and every destroy is refused with one sentence saying why. Nothing
is guessed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import atomic_write_text, kind_of, read_regular
from nodeagent.base.jsontext import NotJson, check_seal, parse_json, sealed_text
from nodeagent.base.logs import get_logger
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.state.held import UNKNOWN_GPU, PreparedDevice, device_of, on_gpu, typed
from nodeagent.state.snapshot import Allocations, Holder, Holders

log = get_logger("nodeagent.owners")
VERSION = 2  # sealed, the one device type; version 1 is read as it was written
OWNERS_NAME = "owners.json"
CLAIM = "claim"


@dataclass(frozen=True)
class ClaimOwner:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = ()

    def holder(self, uid: str) -> Holder:
        """The claim by name; by UID where only its traces named it (a rebuilt record)."""
        if not self.name:
            return Holder("", f"with UID {uid}", "", kind=CLAIM)
        return Holder(self.namespace, self.name, "", kind=CLAIM)


@dataclass(frozen=True)
class Owners:
    claims: Mapping[str, ClaimOwner] = field(default_factory=dict)
    config: str | None = None
    uncertain: str | None = None  # why the owners are unknown: every destroy is refused

    def with_claim(self, uid: str, owner: ClaimOwner) -> Owners:
        return replace(self, claims={**self.claims, uid: owner})

    def without(self, uid: str) -> Owners:
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})

    def holders(self, inventory: Inventory | None) -> dict[str, Holder]:
        """{GPU or MIG UUID: its holder}. A claim's slice still being made has no MIG UUID in
        the record: the slice at its placement is found in `inventory`. An uncertain record
        holds every GPU and slice of `inventory`."""
        held: dict[str, Holder] = {}
        gpus = {g.uuid: g for g in inventory.gpus} if inventory is not None else {}
        if self.uncertain is not None:
            unknown = Holder("", "", "", kind=f"an unknown owner ({self.uncertain})")
            for g in gpus.values():
                held[g.uuid] = unknown
                held.update({s.mig_uuid: unknown for s in g.slices if s.mig_uuid})
        for uid, owner in sorted(self.claims.items()):
            for d in owner.devices:
                if d.admin:
                    continue
                uuid = d.mig_uuid if d.is_mig else d.gpu_uuid
                gpu = gpus.get(d.gpu_uuid)
                if d.is_mig and gpu is not None:
                    there = next(
                        (
                            s
                            for s in gpu.slices
                            if s.placement.start == d.placement_start
                            and s.profile_id == d.profile_id
                        ),
                        None,
                    )
                    uuid = there.mig_uuid if there is not None else uuid
                if uuid:
                    held.setdefault(uuid, owner.holder(uid))
        return held

    def owner_of(
        self,
        gpu_uuid: str,
        start: int,
        size: int,
        but: str = "",
        share: PreparedDevice | None = None,
    ) -> str | None:
        """The claim (other than `but`) holding any of those memory slices of that GPU; a
        claim holding the same share as `share` does not count (shares of a device coexist)."""
        for uid, owner in self.claims.items():
            for d in owner.devices:
                if uid == but or d.gpu_uuid != gpu_uuid or d.admin:
                    continue
                if share is not None and d.same_share(share):
                    continue
                if d.overlaps_slices(start, size):
                    return f"claim {owner.namespace}/{owner.name}"
        return None

    def sharing(self, share: PreparedDevice, but: str) -> list[str]:
        """The claims (other than `but`) holding the same share as `share`, by name."""
        return [
            f"claim {o.namespace}/{o.name}"
            for uid, o in sorted(self.claims.items())
            if uid != but and any(d.same_share(share) for d in o.devices)
        ]

    def to_json(self) -> str:
        claims = {uid: asdict(c) for uid, c in sorted(self.claims.items())}
        return sealed_text({"version": VERSION, "config": self.config, "claims": claims})


def owners_path(lock_path: Path | None) -> Path | None:
    """Beside the MIG writer lock (None: an emulator in one process keeps it in memory)."""
    return None if lock_path is None else lock_path.with_name(OWNERS_NAME)


def _parse(raw: bytes, path: Path) -> Owners:
    """Raises ConfigError for anything but a version-1 or a sealed version-2 record with
    well-typed fields."""
    try:
        data = parse_json(raw)
        if not isinstance(data, dict) or type(data.get("version")) is not int:
            raise ValueError(f"not a version {VERSION} record")
        if data["version"] not in (1, VERSION):
            raise ValueError(f"not a version {VERSION} record")
        broken = check_seal(data) if data["version"] == VERSION else None
        if broken is not None:
            raise ValueError(f"not trusted: {broken}")
        config = data.get("config")
        if config is not None and not isinstance(config, str):
            raise ValueError("'config' is not a string")
        if not isinstance(data.get("claims"), dict):
            raise ValueError("'claims' is not a mapping")
        read = device_of if data["version"] == VERSION else _v1_device
        claims = {}
        for uid, entry in data["claims"].items():
            devices = []
            for d in entry["devices"]:
                try:
                    devices.append(read(d))
                except (TypeError, KeyError, AttributeError) as err:
                    raise ValueError(f"claim {uid}: a device is malformed ({err})") from err
            if not isinstance(entry["namespace"], str) or not isinstance(entry["name"], str):
                raise ValueError(f"claim {uid}: namespace and name must be strings")
            claims[str(uid)] = ClaimOwner(entry["namespace"], entry["name"], tuple(devices))
    except NotJson as err:
        raise ConfigError(f"ownership record {path} is unreadable (it is {err})") from err
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ConfigError(f"ownership record {path} is unreadable ({err})") from err
    return Owners(claims, config)


_V1_DEVICE = {
    "gpu_uuid": (str,), "start": (int, type(None)), "size": (int, type(None)),
    "profile_id": (int, type(None)), "mig_uuid": (str, type(None)), "shared": (bool,),
}  # fmt: skip


def _v1_device(raw: Any) -> PreparedDevice:
    """A device of a version-1 record (before the one device type): where it is, by GPU UUID
    and placement. Raises TypeError, KeyError, AttributeError."""
    typed(raw, _V1_DEVICE)
    if set(raw) - set(_V1_DEVICE):
        raise TypeError(f"unknown field {sorted(set(raw) - set(_V1_DEVICE))[0]!r}")
    start, size, profile_id = raw.get("start"), raw.get("size"), raw.get("profile_id")
    placement = None if start is None else (start, size, profile_id)
    shared = raw.get("shared", False)
    return on_gpu(UNKNOWN_GPU, raw["gpu_uuid"], placement, raw.get("mig_uuid"), shared=shared)


MAX_FILE_BYTES = 4 << 20  # as every input file the agent reads


def _load(path: Path) -> Owners | None:
    """The record at `path`, None when there is none. Raises ConfigError (UnreadableFile
    included) for anything but a regular file holding a version-1 record."""
    raw = read_regular(path, "the ownership record", MAX_FILE_BYTES)
    return None if raw is None else _parse(raw, path)


class OwnerStore:
    """The record, read and written by every path. `path` None: kept in memory (an emulator
    in one process). Writers hold the MIG writer lock; reads may happen any time (a write is
    one atomic rename)."""

    def __init__(
        self,
        path: Path | None,
        evidence: Callable[[Inventory | None], Owners],
        inventory: Callable[[], Inventory] | None = None,
    ) -> None:
        self.path = path
        self.evidence = evidence  # rebuilds the record from the node's traces
        self.inventory = inventory
        self._memory: Owners | None = None
        self._lock = threading.Lock()
        self._said: tuple[str, tuple[str, ...], str | None] | None = None  # the last warning

    def read(self) -> Owners:
        """The record; rebuilt from the node when missing or unreadable (see the module)."""
        with self._lock:
            if self.path is None:
                if self._memory is None:
                    self._memory = self._rebuilt("there is none yet")
                return self._memory
            try:
                current = _load(self.path)
            except ConfigError as err:
                return self._rebuilt(str(err))
            return current if current is not None else self._rebuilt(f"{self.path} does not exist")

    def ensure(self) -> Owners:
        """Write the record when there is none or it is unreadable (the DRA driver starting,
        before its first claim): rebuilt once from the node, so that claims prepared later are
        never mistaken for a lost record's traces. An uncertain rebuild is not written."""
        owners = self.read()
        if self.path is not None and owners.uncertain is None:
            try:
                current = _load(self.path)
            except ConfigError:
                current = None
            if current != owners:
                self.write(owners)
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

    def check(self) -> None:
        """Raise ConfigError when the record could not be written: its path holds anything but
        a regular file (a folder, a FIFO, a socket, a symbolic link, dangling or in a loop).
        Asked before a change's first NVML operation, so that a change that would record its
        owners afterwards is refused with nothing changed, not failed with the GPUs changed."""
        if self.path is None:
            return
        try:
            kind = kind_of(os.lstat(self.path).st_mode)
        except FileNotFoundError:
            return
        except OSError as err:
            raise ConfigError(
                f"cannot look at the ownership record {self.path}: {err.strerror}; nothing was"
                " changed"
            ) from err
        if kind is not None:
            raise ConfigError(
                f"the ownership record {self.path} is {kind}, not a regular file; nothing was"
                " changed: move it aside (the record is rebuilt from the node's claims)"
            )

    def write(self, owners: Owners) -> None:
        """Replace the record (the caller holds the MIG writer lock). An uncertain record is
        never written: its uncertainty is rebuilt at every read until the sources are
        readable. Raises ConfigError when the file cannot be written."""
        owners = replace(owners, uncertain=None) if owners.uncertain is None else owners
        with self._lock:
            if self.path is None:
                self._memory = owners
                return
            if owners.uncertain is not None:
                return
            try:
                atomic_write_text(self.path, owners.to_json(), mode=0o600)
            except OSError as err:
                raise ConfigError(
                    f"cannot write the ownership record {self.path}: {err.strerror}"
                ) from err

    def update(self, change: Callable[[Owners], Owners]) -> Owners:
        """Read, change, write (under the MIG writer lock, held by the caller)."""
        owners = change(self.read())
        self.write(owners)
        return owners


def holders_of(store: OwnerStore, inventory: Callable[[], Inventory]) -> dict[str, Any]:
    """{UUID: Holder} of every claim in the record (read now)."""
    return store.read().holders(inventory())


def inventory_reader(session: NvmlSession) -> Callable[[], Inventory]:
    def read() -> Inventory:
        with session.lock:
            return read_inventory(session)

    return read


def with_owners(
    allocations: Allocations | None, store: OwnerStore, inventory: Callable[[], Inventory]
) -> Callable[[], Holders]:
    """`allocations` (the kubelet's pod-resources answer; None: no pods known) plus the
    devices the ownership record gives to claims (or every device, when it is uncertain)."""

    def both() -> Holders:
        pods = dict(allocations()) if allocations is not None else {}
        owners = store.read()
        # The GPUs are read again only where the record lacks a UUID (a slice being made) or
        # holds everything (uncertain).
        need = owners.uncertain is not None or any(
            d.is_mig and not d.mig_uuid for c in owners.claims.values() for d in c.devices
        )
        for uuid, holder in owners.holders(inventory() if need else None).items():
            pods.setdefault(uuid, holder)
        return pods

    return both
