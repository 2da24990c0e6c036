"""Which GPUs and MIG devices DRA claims hold, for the busy-slice protection: the reconcile
pipeline and `nodeagent mig apply` plan around them as around a slice a pod holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.dra.checkpoint import load
from nodeagent.snapshot import Allocations, Holder, Holders

CLAIM = "claim"


def claim_holders(checkpoint: Path) -> dict[str, Holder]:
    """{GPU or MIG UUID: the claim holding it} from the DRA checkpoint; a claim still being
    prepared counts too. Raises ConfigError for a checkpoint it cannot read (a MIG change then
    refuses, as when the kubelet cannot be asked)."""
    held: dict[str, Holder] = {}
    for claim in load(checkpoint).claims.values():
        for d in claim.devices:
            uuid = d.mig_uuid if d.is_mig else d.gpu_uuid
            if uuid:
                held.setdefault(uuid, Holder(claim.namespace, claim.name, "", kind=CLAIM))
    return held


def with_claims(allocations: Allocations | None, checkpoint: Path) -> Callable[[], Holders]:
    """`allocations` (the kubelet's pod-resources answer) plus the DRA claims' devices."""

    def both() -> Holders:
        pods = dict(allocations()) if allocations is not None else {}
        for uuid, holder in claim_holders(checkpoint).items():
            pods.setdefault(uuid, holder)
        return pods

    return both
