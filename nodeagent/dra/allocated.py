"""The ResourceClaims the scheduler allocated on this node, for the ownership record's rebuild
(nodeagent.state.owners): a claim allocated here holds its devices even before the kubelet asks
to prepare it, and after a lost record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nodeagent.dra.api import DraApi
from nodeagent.dra.traces import AllocatedClaim

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


def allocated_to(claim: dict[str, Any], driver: str, pool: str) -> bool:
    """Whether `claim` holds a device of `driver` in `pool` (this node's)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(
        isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == pool for r in results
    )


def allocated_claims(api: DraApi, driver: str) -> tuple[list[dict[str, Any]], str | None]:
    """Every claim (all namespaces) with a device of `driver` in this node's pool, as the API
    server holds it, and the list's resourceVersion (to watch from). Raises KubeError when the
    API server cannot be asked."""
    result: dict[str, Any] = (
        api._call("list resourceclaims", lambda: api._request("GET", CLAIMS)) or {}
    )
    items = [i for i in result.get("items") or [] if allocated_to(i, driver, api.name)]
    return items, (result.get("metadata") or {}).get("resourceVersion")


def allocated_here(api: DraApi, driver: str) -> Callable[[], Mapping[str, AllocatedClaim]]:
    """A function listing every claim (all namespaces) with a device of `driver` in this
    node's pool; raises KubeError when the API server cannot be asked."""

    def read() -> Mapping[str, AllocatedClaim]:
        out: dict[str, AllocatedClaim] = {}
        for item in allocated_claims(api, driver)[0]:
            meta = item.get("metadata") or {}
            allocation = (item.get("status") or {}).get("allocation") or {}
            results = (allocation.get("devices") or {}).get("results") or []
            devices = tuple(
                str(r.get("device"))
                for r in results
                if isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == api.name
            )
            uid = meta.get("uid")
            if devices and isinstance(uid, str):
                out[uid] = AllocatedClaim(
                    str(meta.get("namespace", "")), str(meta.get("name", "")), devices
                )
        return out

    return read
