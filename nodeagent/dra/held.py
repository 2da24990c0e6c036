"""Which GPUs and MIG devices DRA claims hold, for the busy-slice protection: the reconcile
pipeline and `nodeagent mig apply` plan around them as around a slice a pod holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.dra.checkpoint import load
from nodeagent.dra.node import CHECKPOINT_NAME
from nodeagent.dra.operations import slice_at
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.settings import Dra
from nodeagent.snapshot import Allocations, Holder, Holders

CLAIM = "claim"


def claim_holders(
    checkpoint: Path, inventory: Callable[[], Inventory] | None = None
) -> dict[str, Holder]:
    """{GPU or MIG UUID: the claim holding it} from the DRA checkpoint. A claim still being
    prepared counts too: its MIG slice has no UUID in the checkpoint until it is prepared (an
    agent killed between the slice's creation and the checkpoint's write), so the slice at its
    placement is found in `inventory` (read only then). Raises ConfigError for a checkpoint it
    cannot read (a MIG change then refuses, as when the kubelet cannot be asked)."""
    claims = load(checkpoint).claims.values()
    gpus = {}
    if inventory is not None and any(
        d.is_mig and not d.mig_uuid for claim in claims for d in claim.devices
    ):
        gpus = {g.index: g for g in inventory().gpus}
    held: dict[str, Holder] = {}
    for claim in claims:
        for d in claim.devices:
            if d.admin:  # looks, holds nothing
                continue
            uuid = d.mig_uuid if d.is_mig else d.gpu_uuid
            if not uuid and d.gpu in gpus:
                there = slice_at(gpus[d.gpu], d.profile_id or 0, d.placement_start or 0)
                uuid = there.mig_uuid if there is not None else None
            if uuid:
                held.setdefault(uuid, Holder(claim.namespace, claim.name, "", kind=CLAIM))
    return held


def with_claims(
    allocations: Allocations | None,
    checkpoint: Path,
    inventory: Callable[[], Inventory] | None = None,
) -> Callable[[], Holders]:
    """`allocations` (the kubelet's pod-resources answer; None: no pods known) plus the DRA
    claims' devices (`inventory`: see claim_holders)."""

    def both() -> Holders:
        pods = dict(allocations()) if allocations is not None else {}
        for uuid, holder in claim_holders(checkpoint, inventory).items():
            pods.setdefault(uuid, holder)
        return pods

    return both


def inventory_reader(session: NvmlSession) -> Callable[[], Inventory]:
    def read() -> Inventory:
        with session.lock:
            return read_inventory(session)

    return read


def checkpointed_claims(
    session: NvmlSession, dra: Dra, pods: Allocations | None = None
) -> Callable[[], Holders]:
    """`pods` plus the claims of the DRA checkpoint in `dra`'s plugin directory, DRA on or
    off: a checkpoint an agent with --dra left holds its claims' slices until the kubelet
    unprepares them (no claims when there is no checkpoint). What `nodeagent mig apply|sharing
    apply` and an agent without --dra count as held."""
    return with_claims(pods, dra.plugin_path / CHECKPOINT_NAME, inventory_reader(session))
