"""The node's one record of who holds what, as a value: every claim of the node with its
state, devices and CDI ids (nodeagent.state.held), the MIG config the pipeline applied last,
and, where it was rebuilt from traces that could not all be read, why it is uncertain. Pure:
read and written by nodeagent.state.owners.

    {"version": 2, "checksum": "sha256:..", "config": "all-balanced", "uncertain": null,
     "claims": {"<uid>": {"namespace": "speech", "name": "asr-0", "state": "prepared",
                          "cdi_ids": ["k8s.gpu.nodeagent.io/claim=<uid>-gpu-0-mig-1g18gb-19-3"],
                          "devices": [{"device": "gpu-0-mig-1g18gb-19-3", "gpu": 0,
                                       "gpu_uuid": "GPU-..", "placement_start": 3,
                                       "placement_size": 1, "profile_id": 19,
                                       "mig_uuid": "MIG-..", ...}]}}}

The record is sealed with a checksum over its content (as the kubelet's checkpointmanager
seals its checkpoints); one that does not match it is not trusted. A version-1 record (before
the fold: unsealed, no states, its devices by `start` and `size` only) is read as it was
written; the store folds the DRA checkpoints of before into it (nodeagent.state.owners).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError, shown
from nodeagent.base.jsontext import NotJson, check_seal, parse_json, sealed_text
from nodeagent.nvml import Inventory
from nodeagent.state.held import (
    UNKNOWN_GPU,
    PreparedClaim,
    PreparedDevice,
    check_device,
    claim_of,
    device_of,
    is_uid,
    on_gpu,
    typed,
)
from nodeagent.state.snapshot import Holder

VERSION = 2  # sealed, with the claims' states; version 1 is read as it was written
CLAIM = "claim"


def holder(uid: str, claim: PreparedClaim) -> Holder:
    """The claim by name; by UID where only its traces named it (a rebuilt record)."""
    if not claim.name:
        return Holder("", f"with UID {uid}", "", kind=CLAIM)
    return Holder(claim.namespace, claim.name, "", kind=CLAIM)


@dataclass(frozen=True)
class Owners:
    """The record. `version`: the file's, as read (1: written before the fold)."""

    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)
    config: str | None = None
    uncertain: str | None = None  # why the owners are unknown: every destroy is refused
    version: int = field(default=VERSION, compare=False)

    def with_claim(self, uid: str, claim: PreparedClaim) -> Owners:
        return replace(self, claims={**self.claims, uid: claim})

    def without(self, uid: str) -> Owners:
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})

    def prepared_here(self, driver: str) -> dict[str, PreparedClaim]:
        """The claims DRA driver `driver` recorded (with a state), not those known from
        traces only nor another driver's."""
        return {u: c for u, c in self.claims.items() if c.state is not None and c.driver == driver}

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
        for uid, claim in sorted(self.claims.items()):
            for d in claim.devices:
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
                    held.setdefault(uuid, holder(uid, claim))
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
        for uid, claim in self.claims.items():
            for d in claim.devices:
                if uid == but or d.gpu_uuid != gpu_uuid or d.admin:
                    continue
                if share is not None and d.same_share(share):
                    continue
                if d.overlaps_slices(start, size):
                    return str(claim)
        return None

    def sharing(self, share: PreparedDevice, but: str) -> list[str]:
        """The claims (other than `but`) holding the same share as `share`, by name (admin
        access to it holds nothing: it keeps no slice)."""
        return [
            str(c)
            for uid, c in sorted(self.claims.items())
            if uid != but and any(d.same_share(share) and not d.admin for d in c.devices)
        ]

    def mps_daemons(self) -> dict[int, str]:
        """{GPU index: the MPS daemon a claim has there}: a share server or a claim's own
        daemon (MpsConfig), of every claim in the record, preparing and unpreparing ones too
        (their daemons may run). The device-plugin path's daemon is never started beside one
        (nodeagent.mps.regimes), whichever process starts it."""
        out: dict[int, str] = {}
        for _uid, claim in sorted(self.claims.items()):
            for d in claim.devices:
                if d.mps is None or d.admin:
                    continue
                server = d.mps.get("server")
                what = (
                    f"the DRA MPS share server {server}"
                    if d.shared and isinstance(server, str)
                    else f"the DRA MPS {'share' if d.shared else 'daemon'} of {claim}"
                )
                out.setdefault(d.gpu, what)
        return out

    def to_json(self) -> str:
        claims = {uid: asdict(c) for uid, c in sorted(self.claims.items())}
        payload = {"version": VERSION, "config": self.config, "claims": claims}
        return sealed_text({**payload, "uncertain": self.uncertain})


def untrusted(owners: Owners, since: Owners | None = None) -> str | None:
    """Why `parse` would not trust `owners` once written (None: it would): a claim UID that is
    not a Kubernetes UID, a claim its reader refuses. Only the claims that are not `since`'s
    (the record as read before a change) are looked at; all of them without it."""
    for uid, claim in sorted(owners.claims.items()):
        if since is not None and since.claims.get(uid) is claim:
            continue
        try:
            _claim(uid, json.loads(json.dumps(asdict(claim))), device_of)
        except ValueError as err:
            return str(err)
    return None


def _claim(uid: object, entry: Any, read: Callable[[Any], PreparedDevice]) -> PreparedClaim:
    """One claim of the record as its reader takes it. Raises ValueError (a UID that is not a
    Kubernetes UID: it would name a folder to remove; a claim half understood)."""
    if not is_uid(uid):
        raise ValueError(f"claim UID {shown(uid)} is not a Kubernetes UID")
    try:
        return claim_of(entry, read)
    except (TypeError, KeyError, AttributeError, ValueError) as err:
        raise ValueError(f"claim {uid} is malformed ({err})") from err


def parse(raw: bytes, path: Path) -> Owners:
    """The record in `raw`. Raises ConfigError for anything but a version-1 or a sealed
    version-2 record with well-typed fields."""
    try:
        data = parse_json(raw)
        version = data.get("version") if isinstance(data, dict) else None
        if type(version) is not int or version not in (1, VERSION):
            raise ValueError(f"not a version {VERSION} record")
        assert isinstance(data, dict)
        broken = check_seal(data) if version == VERSION else None
        if broken is not None:
            raise ValueError(f"not trusted: {broken}")
        typed(data, {"config": (str, type(None)), "uncertain": (str, type(None))})
        if not isinstance(data.get("claims"), dict):
            raise ValueError("'claims' is not a mapping")
        read = device_of if version == VERSION else _v1_device
        claims = {}
        for uid, entry in data["claims"].items():
            claims[str(uid)] = _claim(uid, entry, read)
    except NotJson as err:
        raise ConfigError(f"ownership record {path} is unreadable (it is {err})") from err
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ConfigError(f"ownership record {path} is unreadable ({err})") from err
    return Owners(claims, data.get("config"), data.get("uncertain"), version)


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
    device = on_gpu(UNKNOWN_GPU, raw["gpu_uuid"], placement, raw.get("mig_uuid"), shared=shared)
    check_device(device)
    return device
