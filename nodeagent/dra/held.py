"""Which GPUs and MIG devices DRA claims hold, for the busy-slice protection: the reconcile
pipeline, `nodeagent mig apply|sharing apply` and the DRA driver itself plan around them as
around a slice a pod holds. The holders come from the one ownership record
(nodeagent.dra.owners), whatever the DRA settings of the command that reads it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.dra.checkpoint import load
from nodeagent.dra.owners import OwnerStore, evidence_of, owners_path
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.settings import Dra
from nodeagent.settings.groups import DEFAULT_KUBELET_PLUGINS
from nodeagent.snapshot import Allocations, Holder, Holders

CLAIM = "claim"


def claim_holders(checkpoint: Path) -> dict[str, Holder]:
    """{GPU or MIG UUID: the claim holding it} as one DRA checkpoint records it (prepared
    claims with their UUIDs). Raises ConfigError for a checkpoint it cannot read."""
    held: dict[str, Holder] = {}
    for claim in load(checkpoint).claims.values():
        for d in claim.devices:
            uuid = d.mig_uuid if d.is_mig else d.gpu_uuid
            if uuid and not d.admin:
                held.setdefault(uuid, Holder(claim.namespace, claim.name, "", kind=CLAIM))
    return held


def inventory_reader(session: NvmlSession) -> Callable[[], Inventory]:
    def read() -> Inventory:
        with session.lock:
            return read_inventory(session)

    return read


def owner_store(session: NvmlSession, dra: Dra, lock_path: Path | None) -> OwnerStore:
    """The node's ownership record, beside the MIG writer lock at `lock_path`; rebuilt when
    missing from the DRA traces in `dra`'s directories and the default ones."""
    plugin_dirs = (dra.plugin_path, DEFAULT_KUBELET_PLUGINS / dra.driver)
    evidence = evidence_of(dra.driver, plugin_dirs, (dra.cdi_dir,))
    return OwnerStore(owners_path(lock_path), evidence, inventory_reader(session))


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
