"""The DRA checkpoint, the kubelet plugin's account of which claims this node prepared and what
each created: a view of the node's ownership record (nodeagent.state.owners, the one
authority), written from it by the driver, in order, at each change of its claims: before a
mutation (the claim and what it will create: state `preparing`), after (state `prepared`, with
the MIG devices' ids and the CDI ids), while undoing (`unpreparing`), and without the claim once
it is gone (NVIDIA's DRA driver keeps PrepareStarted / PrepareCompleted in its checkpoint,
cmd/gpu-kubelet-plugin/checkpoint.go). The driver never decides from it: it is what an operator
reads, what the ownership record is rebuilt from when that is lost (nodeagent.dra.traces), and
what /readyz checks (a view that cannot be read says the disk or a hand went wrong).

    {"version": 2, "checksum": "sha256:..", "claims": {"<uid>": {"namespace": .., "name": ..,
      "state": "prepared", "cdi_ids": [..],
      "devices": [{"request": .., "device": "gpu-0-mig-1g18gb-19-0", "gpu": 0, ...}]}}}

Its claims and devices are the record's types (nodeagent.state.held). The checksum is over
the rest of the file (as the kubelet's checkpointmanager seals its checkpoints): a file that
does not match it is refused with one sentence, never trusted. A version-1 checkpoint (the
unsealed one written before the fold, when it was the driver's own record) is read as it was;
the ownership record of before is upgraded from it (nodeagent.dra.traces.upgrade).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import atomic_write_text, read_regular
from nodeagent.base.jsontext import NotJson, check_seal, parse_json, sealed_text
from nodeagent.state.held import (
    PREPARED,
    PREPARING,
    UNPREPARING,
    PreparedClaim,
    PreparedDevice,
    claim_of,
    is_uid,
)

MAX_FILE_BYTES = 4 << 20  # as every input file the agent reads

VERSION = 2  # sealed with a checksum; version 1 (before it) is read as it was written
VERSIONS = (1, VERSION)


@dataclass(frozen=True)
class Checkpoint:
    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)

    def to_json(self) -> str:
        claims = {uid: asdict(c) for uid, c in sorted(self.claims.items())}
        return sealed_text({"version": VERSION, "claims": claims})


def _claim(uid: str, raw: Any, path: Path) -> PreparedClaim:
    """One claim of the file. Raises ConfigError naming the claim for a value of the wrong
    type: a claim that is half understood is not trusted to say which slices it holds."""
    try:
        if not is_uid(uid):  # it would name a folder to remove
            raise ValueError("its UID is not a Kubernetes UID")
        claim = claim_of(raw)
        if claim.state is None:
            raise TypeError("state is None")
        return claim
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise ConfigError(f"DRA checkpoint {path}: claim {uid} is malformed ({err})") from err


def _is_version(value: object) -> bool:
    return type(value) is int and value in VERSIONS  # JSON `true` is no 1


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
    broken = check_seal(data) if data["version"] == VERSION else None
    if broken is not None:
        raise ConfigError(f"DRA checkpoint {path} is not trusted: {broken}")
    claims = data.get("claims")
    if not isinstance(claims, dict):
        raise ConfigError(f"DRA checkpoint {path}: 'claims' is not a mapping")
    return Checkpoint({uid: _claim(uid, raw, path) for uid, raw in claims.items()})


def save(path: Path, checkpoint: Checkpoint, *, durable: bool = True) -> None:
    """Replace the file atomically (rename): a crash leaves the old or the new one. The
    driver's view skips the fsync (`durable` off): the ownership record it follows is the
    durable one, and the view is written again from it at the next change and at start."""
    try:
        atomic_write_text(path, checkpoint.to_json(), mode=0o600, durable=durable)
    except OSError as err:
        raise ConfigError(f"cannot write DRA checkpoint {path}: {err.strerror}") from err


__all__ = [
    "PREPARED", "PREPARING", "UNPREPARING", "Checkpoint", "PreparedClaim", "PreparedDevice",
    "load", "save",
]  # fmt: skip
