"""The ResourceClaims the scheduler allocated on this node, for the ownership record's rebuild
(nodeagent.state.owners): a claim allocated here holds its devices even before the kubelet asks
to prepare it, and after a lost record."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nodeagent.dra.claims import checked_claim
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.resource import API_PATH
from nodeagent.dra.traces import AllocatedClaim
from nodeagent.kube.informer import Informer, Source

CLAIMS = f"{API_PATH}/resourceclaims"
RESOURCE = "resourceclaims"


def allocated_to(claim: dict[str, Any], driver: str, pool: str) -> bool:
    """Whether `claim` (read: checked_claim) holds a device of `driver` in `pool` (this
    node's)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") == driver and r.get("pool") == pool for r in results)


def claims_source(api: DraApi) -> Source:
    """Every ResourceClaim of the cluster, listed and watched."""
    return Source(
        RESOURCE,
        lambda: api.list_objects(RESOURCE, CLAIMS),
        lambda version: api.watch(RESOURCE, CLAIMS, version),
    )


class _Kept:
    def __init__(self) -> None:
        self.claims: Sequence[dict[str, Any]] = ()

    def listed(self, objects: Sequence[dict[str, Any]]) -> None:
        self.claims = objects

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        """A list only: never watched."""


def allocated_claims(api: DraApi, driver: str) -> tuple[list[dict[str, Any]], str | None]:
    """Every claim (all namespaces) with a device of `driver` in this node's pool, as the API
    server holds it, and the list's resourceVersion (to watch from). A claim that cannot be
    read is skipped and said once (nodeagent.kube.informer). Raises KubeError when the API
    server cannot be asked."""
    kept = _Kept()
    informer = Informer(claims_source(api), checked_claim, kept, api.stop_event)
    informer.relist()
    here = [c for c in kept.claims if allocated_to(c, driver, api.name)]
    return here, informer.version


def devices_here(claim: dict[str, Any], driver: str, pool: str) -> AllocatedClaim | None:
    """The claim's devices of `driver` in `pool`, or None when it has none there."""
    meta = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    devices = tuple(
        str(r.get("device"))
        for r in results
        if r.get("driver") == driver and r.get("pool") == pool and r.get("device")
    )
    if not devices or not meta.get("uid"):
        return None
    return AllocatedClaim(str(meta.get("namespace", "")), str(meta.get("name", "")), devices)


def allocated_here(api: DraApi, driver: str) -> Callable[[], Mapping[str, AllocatedClaim]]:
    """A function listing every claim (all namespaces) with a device of `driver` in this
    node's pool; raises KubeError when the API server cannot be asked."""

    def read() -> Mapping[str, AllocatedClaim]:
        out: dict[str, AllocatedClaim] = {}
        for item in allocated_claims(api, driver)[0]:
            found = devices_here(item, driver, api.name)
            if found is not None:
                out[str(item["metadata"]["uid"])] = found
        return out

    return read
