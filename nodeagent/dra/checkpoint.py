"""The DRA checkpoint: which claims this node prepared, and what each created. One JSON file,
replaced atomically, written before a mutation (the claim and what it will create: state
`preparing`) and after (state `prepared`, with the MIG device's ids), so a restart after a crash
at any step knows what each claim owns (NVIDIA's DRA driver keeps the same two states:
PrepareStarted / PrepareCompleted, cmd/gpu-kubelet-plugin/checkpoint.go).

    {"version": 1, "claims": {"<uid>": {"namespace": .., "name": .., "state": "prepared",
      "devices": [{"request": .., "device": "gpu-0-mig-1g18gb-19-0", "gpu": 0, ...}]}}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import atomic_write_text, read_regular
from nodeagent.base.jsontext import NotJson, parse_json

MAX_FILE_BYTES = 4 << 20  # as every input file the agent reads

VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device and what preparing it made. For a MIG slice: the profile and
    placement, whether a slice was already there (`existed`: unprepare leaves it), and once
    made, its GI, CI and MIG UUID."""

    request: str
    pool: str
    device: str
    gpu: int
    gpu_uuid: str
    profile_id: int | None = None
    profile: str | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    existed: bool = False
    gi_id: int | None = None
    ci_id: int | None = None
    mig_uuid: str | None = None
    mps: Mapping[str, Any] | None = None  # thread_percentage, pinned_memory_bytes, pipe_dir
    admin: bool = False  # adminAccess: holds nothing, made nothing
    shared: bool = False  # an MPS share device: other claims may hold the same device
    share_id: str | None = None  # the allocation's shareID (KEP-5075)

    @property
    def is_mig(self) -> bool:
        return self.profile_id is not None

    def overlaps(self, gpu: int, start: int, size: int) -> bool:
        """Whether it holds any memory slice of `size` slices from `start` on GPU `gpu` (a
        whole GPU holds them all; a device with admin access none)."""
        if gpu != self.gpu or self.admin:
            return False
        if not self.is_mig:
            return True
        assert self.placement_start is not None and self.placement_size is not None
        return start < self.placement_start + self.placement_size and self.placement_start < (
            start + size
        )


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    state: str
    devices: tuple[PreparedDevice, ...] = ()
    cdi_ids: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Checkpoint:
    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)

    def with_claim(self, uid: str, claim: PreparedClaim) -> Checkpoint:
        return replace(self, claims={**self.claims, uid: claim})

    def without(self, uid: str) -> Checkpoint:
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})

    def holder_of(self, gpu: int, start: int, size: int, but: str = "") -> PreparedClaim | None:
        """The claim (other than `but`) holding any of those memory slices of GPU `gpu`."""
        for uid, claim in self.claims.items():
            if uid != but and any(d.overlaps(gpu, start, size) for d in claim.devices):
                return claim
        return None

    def to_json(self) -> str:
        claims = {uid: asdict(c) for uid, c in sorted(self.claims.items())}
        return json.dumps({"version": VERSION, "claims": claims}, indent=1, sort_keys=True) + "\n"


_OPTIONAL_INT = ("profile_id", "placement_start", "placement_size", "gi_id", "ci_id")
_DEVICE_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("request", "pool", "device", "gpu_uuid"), (str,)),
    "gpu": (int,),
    **dict.fromkeys(_OPTIONAL_INT, (int, type(None))),
    **dict.fromkeys(("profile", "mig_uuid"), (str, type(None))),
    **dict.fromkeys(("existed", "admin", "shared"), (bool,)),
    "share_id": (str, type(None)),
    "mps": (dict, type(None)),
}


def _typed(values: Mapping[str, Any], types: Mapping[str, tuple[type, ...]]) -> None:
    """Raise TypeError for a value of the wrong JSON type (a bool is no int here)."""
    for key, value in values.items():
        want = types.get(key)
        if want is not None and (
            not isinstance(value, want) or (isinstance(value, bool) and bool not in want)
        ):
            raise TypeError(f"{key} is {value!r}")


def _claim(uid: str, raw: Any, path: Path) -> PreparedClaim:
    """One claim of the file. Raises ConfigError naming the claim for a value of the wrong
    type: a claim that is half understood is not trusted to say which slices it holds."""
    try:
        raw = dict(raw)
        devices = []
        for d in raw.pop("devices"):
            _typed(d, _DEVICE_TYPES)
            devices.append(PreparedDevice(**d))
        cdi_ids = tuple(raw.pop("cdi_ids"))
        _typed(raw, dict.fromkeys(("namespace", "name", "state"), (str,)))
        if raw.get("state") not in (PREPARING, PREPARED) or not all(
            isinstance(i, str) for i in cdi_ids
        ):
            raise TypeError(f"state is {raw.get('state')!r}, CDI ids {list(cdi_ids)!r}")
        return PreparedClaim(devices=tuple(devices), cdi_ids=cdi_ids, **raw)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ConfigError(f"DRA checkpoint {path}: claim {uid} is malformed ({err})") from err


def _is_version(value: object) -> bool:
    return type(value) is int and value == VERSION  # JSON `true` is no 1


def load(path: Path) -> Checkpoint:
    """The checkpoint at `path`; an empty one when there is no file. Raises ConfigError for a
    file that is not a version-1 checkpoint (nothing is guessed about claims it cannot read)."""
    raw = read_regular(path, "DRA checkpoint", MAX_FILE_BYTES)
    if raw is None:
        return Checkpoint()
    try:
        data = parse_json(raw)
    except NotJson as err:
        raise ConfigError(f"DRA checkpoint {path} is {err}") from err
    if not isinstance(data, dict) or not _is_version(data.get("version")):
        raise ConfigError(f"DRA checkpoint {path} is not a version {VERSION} checkpoint")
    claims = data.get("claims")
    if not isinstance(claims, dict):
        raise ConfigError(f"DRA checkpoint {path}: 'claims' is not a mapping")
    return Checkpoint({uid: _claim(uid, raw, path) for uid, raw in claims.items()})


def save(path: Path, checkpoint: Checkpoint) -> None:
    """Replace the file atomically (fsync, rename): a crash leaves the old or the new one."""
    try:
        atomic_write_text(path, checkpoint.to_json(), mode=0o600)
    except OSError as err:
        raise ConfigError(f"cannot write DRA checkpoint {path}: {err.strerror}") from err
