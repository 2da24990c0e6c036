"""Where the DRA driver leaves traces of its claims, and the ownership record rebuilt from
them (nodeagent.state.owners) when it is missing or unreadable: the plugin directories'
checkpoints and MPS roots, the claims' CDI specs, the claims the API server allocated here."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import read_regular
from nodeagent.base.jsontext import NotJson, parse_json
from nodeagent.base.shapes import Shape, problem
from nodeagent.dra import cdi
from nodeagent.dra.capacity import SHARE_SUFFIX
from nodeagent.dra.checkpoint import Checkpoint
from nodeagent.dra.checkpoint import load as load_checkpoint
from nodeagent.dra.devices import DeviceRef, parse_device_name
from nodeagent.nvml import Inventory, NvmlSession
from nodeagent.nvml.inventory import Gpu
from nodeagent.settings import Dra
from nodeagent.settings.groups import DEFAULT_KUBELET_PLUGINS
from nodeagent.state.held import PreparedClaim, PreparedDevice, is_uid, on_gpu
from nodeagent.state.owners import (
    CLAIM,
    MAX_FILE_BYTES,
    Owners,
    OwnerStore,
    inventory_reader,
    owners_path,
)
from nodeagent.state.snapshot import Holder

DEFAULT_CDI_DIRS = (Path("/var/run/cdi"), Path("/etc/cdi"))


@dataclass(frozen=True)
class AllocatedClaim:
    """A ResourceClaim the scheduler allocated devices of this node's pool to (the API's
    answer): its devices by name."""

    namespace: str
    name: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class Evidence:
    """Where the DRA driver leaves traces of its claims: plugin directories (checkpoint.json,
    mps/<uid>/<device>), CDI directories (k8s.<driver>-claim_<uid>.json) and, with an API
    server (`api`: the claims allocated on this node, by UID), the claims themselves."""

    driver: str
    plugin_dirs: tuple[Path, ...] = ()
    cdi_dirs: tuple[Path, ...] = DEFAULT_CDI_DIRS
    api: Callable[[], Mapping[str, AllocatedClaim]] | None = None

    def __call__(self, inventory: Inventory | None) -> Owners:
        """The record rebuilt from these traces (OwnerStore's `evidence`)."""
        return rebuild(self, inventory)

    def upgrade(self, before: Owners) -> Owners:
        """A version-1 ownership record with the DRA checkpoints of before folded into it
        (OwnerStore's `upgrade`): each claim a checkpoint holds comes with its state,
        devices and CDI ids; the record's other claims stay, held from their traces. A
        checkpoint that cannot be read leaves the record uncertain."""
        claims = dict(before.claims)
        problems = []
        for d in self.plugin_dirs:
            try:
                claims.update(_driven(load_checkpoint(d / "checkpoint.json"), self.driver))
            except ConfigError as err:
                problems.append(str(err))
        uncertain = "; ".join(problems) if problems else before.uncertain
        return Owners(claims, before.config, uncertain, before.version)


def _unique(paths: Iterable[Path]) -> tuple[Path, ...]:
    return tuple(dict.fromkeys(paths))


def evidence_of(
    driver: str,
    plugin_dirs: Iterable[Path],
    cdi_dirs: Iterable[Path],
    api: Callable[[], Mapping[str, AllocatedClaim]] | None = None,
) -> Evidence:
    return Evidence(driver, _unique(plugin_dirs), _unique([*cdi_dirs, *DEFAULT_CDI_DIRS]), api)


def rebuild(evidence: Evidence, inventory: Inventory | None) -> Owners:
    """The claims' devices as the node shows them. A source that exists but cannot be read
    makes the record uncertain (every destroy refused)."""
    claims: dict[str, PreparedClaim] = {}
    problems: list[str] = []
    for d in evidence.plugin_dirs:
        try:
            checkpoint = load_checkpoint(d / "checkpoint.json")
        except ConfigError as err:
            problems.append(str(err))
            continue
        claims.update(_driven(checkpoint, evidence.driver))  # the driver's claims, whole
        _mps_roots(d / "mps", inventory, claims, problems)
    for d in evidence.cdi_dirs:
        _cdi_specs(d, evidence.driver, inventory, claims, problems)
    if evidence.api is not None:
        _api_claims(evidence.api, inventory, claims, problems)
    if problems:
        return Owners(claims, uncertain="; ".join(problems))
    return Owners(claims)


def _driven(checkpoint: Checkpoint, driver: str) -> dict[str, PreparedClaim]:
    """A checkpoint's claims, each with the driver whose plugin directory holds it (one of
    before did not say)."""
    return {u: c if c.driver else replace(c, driver=driver) for u, c in checkpoint.claims.items()}


def _where(d: PreparedDevice) -> tuple[str, int | None, int | None, bool]:
    return d.gpu_uuid, d.placement_start, d.profile_id, d.shared


def _add(claims: dict[str, PreparedClaim], uid: str, held: PreparedDevice) -> None:
    """`held` into the claim's devices, unless a trace read earlier found it there. A trace
    whose claim UID is no Kubernetes UID (a CDI spec named `..._...json`) is none of the
    driver's, which names its files by the kubelet's checked UIDs: it would name a folder out
    of its own, so it is never taken into the record."""
    if not is_uid(uid):
        return
    owner = claims.get(uid) or PreparedClaim("", "")
    if all(_where(d) != _where(held) for d in owner.devices):
        claims[uid] = replace(owner, devices=(*owner.devices, held))


def _listdir(path: Path, problems: list[str]) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as err:
        problems.append(f"cannot read {path}: {err.strerror}")
        return []


def _held(gpu: Gpu, ref: DeviceRef, device: str) -> PreparedDevice | None:
    """What a device name holds of `gpu`: the GPU, or its profile's placement (None: the GPU
    has no such placement); a share device's, shared."""
    if not ref.is_mig:
        return on_gpu(gpu.index, gpu.uuid, device=device, shared=ref.shared)
    profile = gpu.profile_by_id(ref.profile_id or 0)
    at = next((p for p in (profile.placements if profile else ()) if p.start == ref.start), None)
    if at is None:
        return None
    placement = (at.start, at.size, ref.profile_id or 0)
    return on_gpu(gpu.index, gpu.uuid, placement, device=device, shared=ref.shared)


def _mps_roots(
    root: Path, inventory: Inventory | None, claims: dict[str, PreparedClaim], problems: list[str]
) -> None:
    """mps/<uid>/<device>: a claim's MPS daemon holds that device's GPU."""
    gpus = {g.index: g for g in inventory.gpus} if inventory is not None else {}
    for uid in _listdir(root, problems):
        for device in _listdir(root / uid, problems):
            ref = parse_device_name(device)
            if ref is None:
                continue
            gpu = gpus.get(ref.gpu)
            if gpu is None:
                problems.append(f"MPS root {root / uid / device} names a GPU this node lacks")
                continue
            _add(claims, uid, _held(gpu, ref, device) or on_gpu(gpu.index, gpu.uuid))


def _cdi_specs(
    root: Path,
    driver: str,
    inventory: Inventory | None,
    claims: dict[str, PreparedClaim],
    problems: list[str],
) -> None:
    """A claim's CDI spec names the GPU or MIG UUIDs it hands its containers."""
    prefix = f"{cdi.vendor(driver)}-{cdi.CLASS}_"
    parents: dict[str, Gpu] = {}
    slices: dict[str, tuple[Gpu, tuple[int, int, int]]] = {}
    if inventory is not None:
        for g in inventory.gpus:
            parents[g.uuid] = g
            for s in g.slices:
                if s.mig_uuid:
                    slices[s.mig_uuid] = (g, (s.placement.start, s.placement.size, s.profile_id))
    for name in _listdir(root, problems):
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        uid = name[len(prefix) : -len(".json")]
        try:
            envs = _cdi_envs(root / name)
        except ConfigError as err:
            problems.append(f"CDI spec {root / name} is unreadable ({err})")
            continue
        for env, shared in envs:
            uuid = env.split("=", 1)[1]
            if uuid in slices:
                gpu, placement = slices[uuid]
                _add(claims, uid, on_gpu(gpu.index, gpu.uuid, placement, uuid, shared=shared))
            elif uuid in parents:
                _add(claims, uid, on_gpu(parents[uuid].index, uuid, shared=shared))
            elif uuid.startswith("MIG-"):
                problems.append(f"CDI spec {root / name} names {uuid}, a MIG device not here")


_CDI_SHAPE: Shape = {"devices": [{"name": str, "containerEdits": {"env": [object]}}]}


def _cdi_envs(path: Path) -> list[tuple[str, bool]]:
    """The NVIDIA_VISIBLE_DEVICES values of a CDI spec's devices, each with whether its device
    is a share. Raises ConfigError saying what the file is instead of a CDI spec (the reason
    only: the caller names the file)."""
    raw = read_regular(path, "a CDI spec", MAX_FILE_BYTES)
    if raw is None:
        raise ConfigError("it is gone")
    try:
        spec = parse_json(raw)
    except NotJson as err:
        raise ConfigError(f"it is {err}") from err
    found = problem(spec, _CDI_SHAPE)
    if found is not None:
        field, how = found
        raise ConfigError(f"it {how}" if field == "the object" else f"its {field} {how}")
    assert isinstance(spec, dict)
    if not isinstance(spec.get("devices"), list):
        raise ConfigError("it has no devices")
    envs = []
    for dev in spec["devices"]:
        edits = dev.get("containerEdits")
        if edits is None:
            raise ConfigError(f"device {dev.get('name')!r} has no containerEdits")
        shared = str(dev.get("name", "")).endswith(SHARE_SUFFIX)
        envs += [
            (e, shared)
            for e in edits.get("env") or ()
            if isinstance(e, str) and e.startswith("NVIDIA_VISIBLE_DEVICES=")
        ]
    return envs


def _api_claims(
    api: Callable[[], Mapping[str, AllocatedClaim]],
    inventory: Inventory | None,
    claims: dict[str, PreparedClaim],
    problems: list[str],
) -> None:
    """The claims the scheduler allocated here hold their devices (a slice not made yet is
    held at its placement: nothing else may take it)."""
    try:
        allocated = api()
    except AgentError as err:
        problems.append(f"cannot list the claims allocated on this node ({err})")
        return
    gpus = {g.index: g for g in inventory.gpus} if inventory is not None else {}
    for uid, claim in allocated.items():
        for device in claim.devices:
            ref = parse_device_name(device)
            gpu = gpus.get(ref.gpu) if ref is not None else None
            if ref is None or gpu is None:
                continue  # another driver's naming, or a GPU this node lacks: nothing held here
            held = _held(gpu, ref, device)
            if held is None:
                continue
            _add(claims, uid, held)
            owner = claims[uid]
            if not owner.name:
                claims[uid] = replace(owner, namespace=claim.namespace, name=claim.name)


def claim_holders(checkpoint: Path) -> dict[str, Holder]:
    """{GPU or MIG UUID: the claim holding it} as one DRA checkpoint records it (prepared
    claims with their UUIDs). Raises ConfigError for a checkpoint it cannot read."""
    held: dict[str, Holder] = {}
    for claim in load_checkpoint(checkpoint).claims.values():
        for d in claim.devices:
            uuid = d.mig_uuid if d.is_mig else d.gpu_uuid
            if uuid and not d.admin:
                held.setdefault(uuid, Holder(claim.namespace, claim.name, "", kind=CLAIM))
    return held


def owner_store(session: NvmlSession, dra: Dra, lock_path: Path | None) -> OwnerStore:
    """The node's ownership record, beside the MIG writer lock at `lock_path`; rebuilt when
    missing from the DRA traces in `dra`'s directories and the default ones."""
    plugin_dirs = (dra.plugin_path, DEFAULT_KUBELET_PLUGINS / dra.driver)
    evidence = evidence_of(dra.driver, plugin_dirs, (dra.cdi_dir,))
    path = owners_path(lock_path)
    return OwnerStore(path, evidence, inventory_reader(session), upgrade=evidence.upgrade)


def with_api(store: OwnerStore, api: Callable[[], Mapping[str, AllocatedClaim]]) -> None:
    """From now on a rebuild of `store`'s record also holds what the claims allocated on this
    node (the API server's answer, `api`) name."""
    if isinstance(store.evidence, Evidence):
        store.evidence = replace(store.evidence, api=api)
