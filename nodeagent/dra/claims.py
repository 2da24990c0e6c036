"""A ResourceClaim's allocation (resource.k8s.io/v1, as JSON) -> what this node must prepare.
Pure.

`status.allocation.devices.results` names each allocated device (request, driver, pool,
device); `status.allocation.devices.config` carries the opaque configs of the claim and of its
DeviceClass, each for some or all requests. nodeagent reads one opaque kind, for its driver:

    apiVersion: gpu.nodeagent.io/v1
    kind: MpsConfig
    threadPercentage: 25     # 1-100: the share of the GPU's SMs each client gets
    pinnedMemory: 16Gi       # optional: each client's device memory limit

Anything else (an unknown key, a bad value, an MPS config on a MIG slice) is an error that
names the claim, and nothing is prepared for it.

An MPS share device (nodeagent.dra.capacity: allowMultipleAllocations, KEP-5075) takes no
MpsConfig: its request is what the scheduler gave the claim, the result's `consumedCapacity`
(`<driver>/sm` percent -> threadPercentage, `<driver>/memory` bytes -> pinnedMemory), and the
result's `shareID` tells the claims that share it apart. The share claims on one device are
the clients of one MPS server (nodeagent.mps.servers), and an MPS server runs as one user: a
claim's user is its pods' runAsUser (nodeagent.dra.users, read at prepare) or, for containers
that set none, an opaque config of its own, so that it gets a daemon of its user (claims of
different users on one device are time-sliced against each other):

    apiVersion: gpu.nodeagent.io/v1
    kind: MpsShare
    user: 1000               # optional: the uid the claim's containers run as (their image's USER)
    smLimit: 60              # optional: the SM ceiling of its clients, request-100 (a percent)
    priority: low            # optional: normal (default) | low: CUDA_MPS_CLIENT_PRIORITY 0 | 1

A share's consumed `sm` is its **request**: what the scheduler counts (at most 100 per device).
Its **limit** is the SM ceiling its clients get (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): the
claim's MpsShare `smLimit`, else its DeviceClass's (a config from the class), else the node's
`dra.mps-share-sm-limit` (default 100: a share bursts into the idle GPU). A node default below
a claim's request gives that claim its request. Memory stays a hard limit equal to the request.
An `smLimit` below the request, or above 100, is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.base.errors import ConfigError, shown
from nodeagent.base.shapes import MapOf, Shape, check
from nodeagent.base.units import MAX_DIGITS, whole_number
from nodeagent.dra.capacity import MEMORY_CAPACITY, SM_CAPACITY
from nodeagent.dra.devices import DeviceRef, parse_device_name
from nodeagent.state.held import MAX_USER, is_uid

CONFIG_API_VERSION = "gpu.nodeagent.io/v1"
MPS_KIND = "MpsConfig"
SHARE_KIND = "MpsShare"
MAX_UID = MAX_USER  # a pod's runAsUser: the record's bound for a share's user
# ASCII digits, a bounded count (nodeagent.base.units.MAX_DIGITS), nothing after the unit.
_QUANTITY = re.compile(rf"([0-9]{{1,{MAX_DIGITS}}})(Ki|Mi|Gi|Ti|K|M|G|T)?")
_UNITS = {
    None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}  # fmt: skip


PRIORITIES = ("normal", "low")  # an MpsShare's priority: CUDA_MPS_CLIENT_PRIORITY 0 | 1


@dataclass(frozen=True)
class Mps:
    """An MPS share: the clients' active thread percentage (a share's request) and pinned
    memory limit; a share's SM limit (its clients' ceiling) and priority."""

    thread_percentage: int
    pinned_memory_bytes: int | None = None
    user: int | None = None  # a share's: the uid of its clients (its MPS server's user)
    sm_limit_percent: int | None = None  # a share's: its clients' SM ceiling (request-100)
    priority: str | None = None  # a share's: normal | low

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "thread_percentage": self.thread_percentage,
            "pinned_memory_bytes": self.pinned_memory_bytes,
        }
        if self.user is not None:
            out["user"] = self.user
        if self.sm_limit_percent is not None:
            out["sm_limit_percent"] = self.sm_limit_percent
        if self.priority is not None:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class ShareConfig:
    """An MpsShare config: each field None where it says nothing (a later config's word on
    it, or the node's default, stands)."""

    user: int | None = None
    sm_limit_percent: int | None = None
    priority: str | None = None
    limit_from: str = ""  # whose smLimit it is, for a sentence: "" (the claim's), the class's

    def over(self, earlier: ShareConfig) -> ShareConfig:
        """This config's fields over `earlier`'s (a claim's over its class's)."""
        mine = self.sm_limit_percent is not None
        return ShareConfig(
            earlier.user if self.user is None else self.user,
            self.sm_limit_percent if mine else earlier.sm_limit_percent,
            earlier.priority if self.priority is None else self.priority,
            self.limit_from if mine else earlier.limit_from,
        )


@dataclass(frozen=True)
class ClaimedDevice:
    request: str
    pool: str
    device: str
    ref: DeviceRef
    mps: Mps | None = None
    admin: bool = False  # adminAccess: see the GPU as it is, hold and change nothing
    share_id: str | None = None  # the allocation's shareID on an MPS share device


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name}"


# What the API server accepts, matched whole (fullmatch: `$` would take a trailing newline),
# so a value never steers a path (the UID names the MPS root and the CDI spec file) nor floods
# an error. The UID rule is the ownership record's (is_uid), so a claim that prepares is one
# the record reads back.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # DNS-1123 label: a namespace
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # DNS-1123 subdomain
quoted = shown  # `value` for an error: repr'd (escapes shown), cut short (the record's rule)


def checked_ref(namespace: object, name: object, uid: object) -> ClaimRef:
    """A claim reference from the kubelet, checked before it touches a path or the API.
    Raises ConfigError naming the first bad field (quoted, cut short)."""
    for what, value, valid in (
        ("UID", uid, is_uid),
        ("namespace", namespace, _LABEL.fullmatch),
        ("name", name, _SUBDOMAIN.fullmatch),
    ):
        if not isinstance(value, str) or not valid(value):
            raise ConfigError(
                f"the claim's {what} {quoted(value)} is not a valid Kubernetes {what}"
            )
    assert isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str)
    return ClaimRef(namespace, name, uid)


def parse_quantity(text: object, what: str) -> int:
    """A Kubernetes quantity of bytes ('16Gi', '500M', '1073741824') -> bytes."""
    m = _QUANTITY.fullmatch(str(text)) if isinstance(text, str | int) else None
    if m is None or int(m.group(1)) == 0:
        raise ConfigError(f"{what} {quoted(text)} is not a quantity of bytes like 16Gi or 500M")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_mps(params: Mapping[str, Any], where: str) -> Mps:
    """An MpsConfig's parameters -> Mps. Raises ConfigError naming every problem."""
    problems = []
    known = {"apiVersion", "kind", "threadPercentage", "pinnedMemory"}
    problems += [f"unknown key {k!r}" for k in sorted(set(params) - known)]
    pct = params.get("threadPercentage")
    if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
        problems.append(f"threadPercentage must be a whole number 1-100, not {pct!r}")
    pinned: int | None = None
    if params.get("pinnedMemory") is not None:
        try:
            pinned = parse_quantity(params["pinnedMemory"], "pinnedMemory")
        except ConfigError as err:
            problems.append(str(err))
        else:
            if pinned < 1 << 20:
                problems.append("pinnedMemory must be at least 1Mi (the daemon takes whole MiB)")
    if problems:
        raise ConfigError(f"{where}: MpsConfig: " + "; ".join(problems))
    assert isinstance(pct, int)
    return Mps(pct, pinned)


def share_mps(result: Mapping[str, Any], driver: str, where: str) -> Mps:
    """The MPS limits of an allocation result on a share device: its consumedCapacity's
    `<driver>/sm` (percent, 1-100) as the thread percentage and `<driver>/memory` (bytes, at
    least 1Mi, whole MiB) as the pinned memory limit. Raises ConfigError naming what is
    missing or wrong (no consumedCapacity: the API server or scheduler runs without
    DRAConsumableCapacity, and the share has no size)."""
    device = result.get("device")
    consumed = result.get("consumedCapacity") or {}
    sm = consumed.get(f"{driver}/{SM_CAPACITY}")
    memory = consumed.get(f"{driver}/{MEMORY_CAPACITY}")
    if sm is None or memory is None:
        raise ConfigError(
            f"{where}: {device} is an MPS share but its allocation has no consumedCapacity"
            f" {driver}/{SM_CAPACITY} and {driver}/{MEMORY_CAPACITY} (is the DRAConsumableCapacity"
            " feature gate off on kube-apiserver or kube-scheduler?)"
        )
    problems = []
    pct = whole_number(sm, 3)
    if pct is None or not 1 <= pct <= 100:
        problems.append(f"{SM_CAPACITY} {quoted(sm)} is not a whole percentage 1-100")
    pinned = 0
    try:
        pinned = parse_quantity(memory, MEMORY_CAPACITY)
    except ConfigError as err:
        problems.append(str(err))
    else:
        if pinned < 1 << 20:
            problems.append(f"{MEMORY_CAPACITY} {memory!r} is under 1Mi")
    if problems:
        raise ConfigError(f"{where}: {device}'s consumed capacity: " + "; ".join(problems))
    assert pct is not None
    return Mps(pct, pinned >> 20 << 20)


def parse_share(params: Mapping[str, Any], where: str) -> ShareConfig:
    """An MpsShare's parameters (`user`, `smLimit`, `priority`, each optional) -> ShareConfig.
    Raises ConfigError naming every problem."""
    known = {"apiVersion", "kind", "user", "smLimit", "priority"}
    problems = [f"unknown key {k!r}" for k in sorted(set(params) - known)]
    user, limit, priority = params.get("user"), params.get("smLimit"), params.get("priority")
    if user is not None and (
        isinstance(user, bool) or not isinstance(user, int) or not 0 <= user <= MAX_UID
    ):
        problems.append(f"user must be a uid, a whole number 0-{MAX_UID}, not {quoted(user)}")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100
    ):
        problems.append(f"smLimit must be a whole percentage 1-100, not {quoted(limit)}")
    if priority is not None and priority not in PRIORITIES:
        problems.append(f"priority must be normal or low, not {quoted(priority)}")
    if problems:
        raise ConfigError(f"{where}: {SHARE_KIND}: " + "; ".join(problems))
    return ShareConfig(user, limit, priority)


def share_limits(mps: Mps, config: ShareConfig, default_limit: int, where: str, device: str) -> Mps:
    """A share's Mps (its request from the consumed capacity) with its user, its SM limit
    (the configs', else `default_limit`, never below the request) and its priority. Raises
    ConfigError when a config's smLimit is below the request."""
    limit = config.sm_limit_percent
    if limit is not None and limit < mps.thread_percentage:
        raise ConfigError(
            f"{where}: {device}: {config.limit_from}smLimit {limit} is below the claim's request of"
            f" {mps.thread_percentage} % of the SMs; a limit is between the request and 100"
        )
    if limit is None:
        limit = max(default_limit, mps.thread_percentage)
    priority = config.priority or "normal"
    return replace(mps, user=config.user, sm_limit_percent=limit, priority=priority)


def _configs(
    allocation: Mapping[str, Any], driver: str, where: str
) -> list[tuple[set[str], Mps | ShareConfig]]:
    """(requests it applies to (empty: all), Mps or ShareConfig) for each of this driver's
    opaque configs; class configs first, then the claim's, so the claim's win."""
    out: list[tuple[int, set[str], Mps | ShareConfig]] = []
    for entry in (allocation.get("devices") or {}).get("config") or []:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        params = opaque.get("parameters") or {}
        kind = params.get("kind")
        if params.get("apiVersion") != CONFIG_API_VERSION or kind not in (MPS_KIND, SHARE_KIND):
            raise ConfigError(
                f"{where}: opaque config for {driver} must be apiVersion {CONFIG_API_VERSION}"
                f" kind {MPS_KIND} or {SHARE_KIND}, not {params.get('apiVersion')!r}"
                f" {params.get('kind')!r}"
            )
        rank = 0 if entry.get("source") == "FromClass" else 1
        parsed = parse_mps(params, where) if kind == MPS_KIND else parse_share(params, where)
        if rank == 0 and isinstance(parsed, ShareConfig):  # a limit of the class, said so
            parsed = replace(parsed, limit_from="the DeviceClass's MpsShare ")
        out.append((rank, set(entry.get("requests") or []), parsed))
    out.sort(key=lambda t: t[0])
    return [(requests, mps) for _, requests, mps in out]


_RESULT: Shape = {
    "request": str, "driver": str, "pool": str, "device": str, "shareID": str,
    "adminAccess": bool, "consumedCapacity": MapOf((str, int)),
    "bindingConditions": [str], "bindingFailureConditions": [str],
}  # fmt: skip
_CONFIG: Shape = {
    "source": str, "requests": [str], "opaque": {"driver": str, "parameters": dict},
}  # fmt: skip
_ENTRY: Shape = {
    "driver": str, "pool": str, "device": str, "shareID": str, "data": dict,
    "conditions": [{"type": str, "status": str, "lastTransitionTime": str}],
}  # fmt: skip
METADATA: Shape = {
    "metadata": {
        "name": str, "namespace": str, "uid": str, "resourceVersion": str, "generation": int,
        "deletionTimestamp": str,
    }
}  # fmt: skip
CLAIM: Shape = {
    **METADATA,  # type: ignore[dict-item]
    "status": {
        "allocation": {"devices": {"results": [_RESULT], "config": [_CONFIG]}},
        "devices": [_ENTRY],
    },
}


def checked_claim(obj: object, what: str = "a ResourceClaim") -> dict[str, Any]:
    """`obj`, once every field of it that the driver reads has its JSON type (the metadata,
    the allocation's results and configs, the status entries). Raises Unreadable (a
    ConfigError) naming the claim and the first wrong field, in one sentence."""
    check(obj, METADATA, what)
    assert isinstance(obj, dict)
    meta = obj.get("metadata") or {}
    if meta.get("namespace") and meta.get("name"):
        what = f"claim {meta['namespace']}/{meta['name']}"
    check(obj, CLAIM, what)
    return obj


def claimed_devices(
    claim: Mapping[str, Any], driver: str, pool: str, default_sm_limit: int = 100
) -> list[ClaimedDevice]:
    """This node's devices in the claim's allocation, each with its MPS share if one applies
    (a share's SM limit `default_sm_limit` where no config sets one). Raises ConfigError when
    the claim is not allocated, names a device this driver never published, or its config is
    bad (Unreadable: a field it reads has the wrong JSON type)."""
    claim = checked_claim(claim)
    meta = claim.get("metadata") or {}
    where = f"claim {meta.get('namespace')}/{meta.get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ConfigError(f"{where} is not allocated")
    configs = _configs(allocation, driver, where)
    out: list[ClaimedDevice] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != driver or result.get("pool") != pool:
            continue
        request, device = str(result.get("request", "")), str(result.get("device", ""))
        ref = parse_device_name(device)
        if ref is None:
            raise ConfigError(f"{where}: device {quoted(device)} is not one {driver} publishes")
        admin = result.get("adminAccess") is True
        mps: Mps | None = None
        share: ShareConfig | None = None
        for requests, candidate in configs if not admin else ():
            # A subrequest ('gpu/small') matches a config naming its request ('gpu').
            if not requests or request in requests or request.split("/", 1)[0] in requests:
                if isinstance(candidate, Mps):
                    mps = candidate
                else:
                    share = candidate.over(share or ShareConfig())
        if share is not None and not ref.shared:
            raise ConfigError(
                f"{where}: {device} is not an MPS share device; an {SHARE_KIND} config (user,"
                " smLimit, priority) applies to a share device's clients (a -mps device)"
            )
        if mps is not None and ref.shared:
            raise ConfigError(
                f"{where}: {device} is an MPS share sized by the scheduler (capacity.requests"
                f" {driver}/{SM_CAPACITY}, {driver}/{MEMORY_CAPACITY}); it takes no MpsConfig"
            )
        if mps is not None and ref.is_mig:
            raise ConfigError(
                f"{where}: an MPS share needs a whole GPU; {device} is a MIG slice (an MpsConfig"
                " does not apply to slices: a share of a slice is its -mps device)"
            )
        if ref.shared and not admin:
            mps = share_mps(result, driver, where)
            mps = share_limits(mps, share or ShareConfig(), default_sm_limit, where, device)
            if any(c.device == device for c in out):
                raise ConfigError(
                    f"{where}: {device} is given to two of its requests; a claim gets one MPS"
                    " daemon a device: ask once, or keep them apart with a distinctAttribute"
                    ' constraint (for example "gpu.nodeagent.io/uuid")'
                )
        share_id = result.get("shareID")
        share_id = share_id if isinstance(share_id, str) else None
        out.append(ClaimedDevice(request, pool, device, ref, mps, admin, share_id))
    if not out:
        raise ConfigError(f"{where} has no device of {driver} on node {pool}")
    return out
