"""A claim's `status.devices` entries (resource.k8s.io/v1 AllocatedDeviceStatus, the
DRAResourceClaimDeviceStatus feature) as this driver reports them. Pure: JSON in, JSON out;
nodeagent.dra.k8s.reports writes them.

Each entry is keyed as its allocation result is (driver, pool, device, shareID) and holds
`data`, what preparing the device made, and one condition, `Ready`:

    data:
      apiVersion: gpu.nodeagent.io/v1
      kind: DeviceStatus
      type: mig                    # gpu | mig | mps
      uuid: MIG-...                # what the container sees (NVIDIA_VISIBLE_DEVICES)
      gpu: {index: 0, uuid: GPU-...}
      mig: {profile: 1g.18gb, profileId: 19, placement: {start: 3, size: 1}, created: true}
      mps: {threadPercentage: 25, pinnedMemoryBytes: 17179869184}    # an MPS share
      adminAccess: true            # a claim with admin access: nothing made or held
    conditions:
      - {type: Ready, status: "True", reason: Prepared, message: ..., lastTransitionTime: ...}

A failed prepare reports `Ready` False, reason PrepareFailed, with the error as its message
(no data: nothing was made). A condition's lastTransitionTime changes only when its status
does; an entry that would not change is not written again.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nodeagent.dra.claims import CONFIG_API_VERSION
from nodeagent.mps.claims import ClaimLimits
from nodeagent.state.held import PreparedDevice

KIND = "DeviceStatus"
READY = "Ready"
PREPARED_REASON = "Prepared"
FAILED_REASON = "PrepareFailed"
MESSAGE_MAX = 1024  # a condition's message may be 32 KiB; an error sentence is far shorter


def device_data(d: PreparedDevice) -> dict[str, Any]:
    """What preparing `d` made, as its entry's `data`."""
    kind = "mps" if d.mps is not None else "mig" if d.is_mig else "gpu"
    data: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": KIND, "type": kind}
    data["uuid"] = d.mig_uuid if d.is_mig and d.mig_uuid else d.gpu_uuid
    data["gpu"] = {"index": d.gpu, "uuid": d.gpu_uuid}
    if d.is_mig:
        data["mig"] = {
            "profile": d.profile,
            "profileId": d.profile_id,
            "placement": {"start": d.placement_start, "size": d.placement_size},
            "created": not d.existed and not d.admin,
        }
    if d.mps is not None:
        mps: dict[str, Any] = {"threadPercentage": int(d.mps["thread_percentage"])}
        if d.mps.get("pinned_memory_bytes"):
            mps["pinnedMemoryBytes"] = int(d.mps["pinned_memory_bytes"])
        if d.shared:  # a share: its request above, its clients' ceiling and priority here
            limits = ClaimLimits.of(d.mps)
            mps["smLimitPercent"] = limits.limit_percent
            mps["priority"] = limits.priority
        data["mps"] = mps
    if d.admin:
        data["adminAccess"] = True
    return data


def describe(data: Mapping[str, Any]) -> str:
    """One sentence for the Ready condition's message."""
    gpu = data.get("gpu") or {}
    on = f"GPU {gpu.get('index')} ({gpu.get('uuid')})"
    if data.get("adminAccess"):
        return f"admin access to {data.get('uuid')} on {on}: nothing made or held"
    if data.get("type") == "mig":
        mig = data.get("mig") or {}
        place = mig.get("placement") or {}
        how = "made" if mig.get("created") else "in use"
        return (
            f"MIG device {data.get('uuid')} ({mig.get('profile')} at memory slice"
            f" {place.get('start')}) {how} on {on}"
        )
    if data.get("type") == "mps":
        mps = data.get("mps") or {}
        pinned = mps.get("pinnedMemoryBytes")
        limit = f", {int(pinned) >> 20} MiB pinned memory" if pinned else ""
        if mps.get("smLimitPercent") is not None:
            return (
                f"an MPS share of {on}: {mps.get('threadPercentage')} % of its SMs requested, up"
                f" to {mps.get('smLimitPercent')} %{limit}, {mps.get('priority')} priority"
            )
        return f"an MPS share of {on}: {mps.get('threadPercentage')} % of its SMs{limit}"
    return f"{on}, whole"


def now_rfc3339(now: datetime.datetime | None = None) -> str:
    when = now or datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(ready: bool, reason: str, message: str, generation: Any, now: str) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": READY,
        "status": "True" if ready else "False",
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "lastTransitionTime": now,
    }
    if isinstance(generation, int) and generation >= 0:
        condition["observedGeneration"] = generation
    return condition


def _results(claim: Mapping[str, Any], driver: str, pool: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results of `driver` in `pool`, one per device (and share)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out, seen = [], set()
    for r in (allocation.get("devices") or {}).get("results") or []:
        if not isinstance(r, Mapping) or r.get("driver") != driver or r.get("pool") != pool:
            continue
        key = (r.get("device"), r.get("shareID"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _entry(driver: str, result: Mapping[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"driver": driver, "pool": result["pool"], "device": result["device"]}
    if result.get("shareID"):
        entry["shareID"] = result["shareID"]
    return entry


def ready_entries(
    driver: str,
    pool: str,
    claim: Mapping[str, Any],
    made: Mapping[str, Mapping[str, Any]],
    now: str,
) -> list[dict[str, Any]]:
    """The entries after a successful prepare: `made` maps each prepared device's name to its
    data (device_data)."""
    generation = (claim.get("metadata") or {}).get("generation")
    out = []
    for result in _results(claim, driver, pool):
        data = made.get(str(result.get("device")))
        if data is None:
            continue
        entry = _entry(driver, result)
        entry["conditions"] = [_condition(True, PREPARED_REASON, describe(data), generation, now)]
        entry["data"] = dict(data)
        out.append(entry)
    return out


def failed_entries(
    driver: str, pool: str, claim: Mapping[str, Any], error: str, now: str
) -> list[dict[str, Any]]:
    """The entries after a failed prepare: Ready False for each of this node's devices."""
    generation = (claim.get("metadata") or {}).get("generation")
    return [
        {
            **_entry(driver, result),
            "conditions": [_condition(False, FAILED_REASON, error, generation, now)],
        }
        for result in _results(claim, driver, pool)
    ]


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _ready(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in entry.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == READY:
            return c
    return None


def current_entries(claim: Mapping[str, Any], driver: str) -> list[Mapping[str, Any]]:
    """The claim's status.devices entries of `driver` now."""
    devices = (claim.get("status") or {}).get("devices") or []
    return [e for e in devices if isinstance(e, Mapping) and e.get("driver") == driver]


def settled(
    wanted: Sequence[dict[str, Any]], current: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]] | None:
    """`wanted`, each Ready condition keeping the lastTransitionTime it has now where its
    status is the same; None when that is exactly what the claim holds (nothing to write)."""
    before = {_key(e): e for e in current}
    out = []
    for entry in wanted:
        old = before.get(_key(entry))
        new_ready, old_ready = _ready(entry), _ready(old) if old is not None else None
        if (
            new_ready is not None
            and old_ready is not None
            and old_ready.get("status") == new_ready.get("status")
        ):
            since = old_ready.get("lastTransitionTime", new_ready["lastTransitionTime"])
            entry = {**entry, "conditions": [{**new_ready, "lastTransitionTime": since}]}
        out.append(entry)
    if len(before) == len(out) and all(before.get(_key(e)) == e for e in out):
        return None
    return out


def merged(
    claim: Mapping[str, Any], driver: str, wanted: Sequence[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The claim's whole status.devices with this driver's entries made `wanted` (settled) and
    every other driver's kept as they are; None when nothing changes."""
    devices = (claim.get("status") or {}).get("devices") or []
    others = [
        dict(e) for e in devices if not (isinstance(e, Mapping) and e.get("driver") == driver)
    ]
    ours = settled(wanted, current_entries(claim, driver))
    return None if ours is None else others + ours


BOUND_REASON = "SliceMade"
BIND_FAILED_REASON = "SliceCreateFailed"


def binding_results(claim: Mapping[str, Any], driver: str, pool: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results of `driver` in `pool` that carry binding conditions
    (copied by the scheduler from the device): those the scheduler waits on in PreBind."""
    return [r for r in _results(claim, driver, pool) if r.get("bindingConditions")]


def binding_settled(claim: Mapping[str, Any], driver: str, pool: str) -> bool:
    """Whether every device the scheduler waits on has all its binding conditions True, or
    one of its failure conditions True: nothing left to say before the pod binds."""
    entries = {_key(e): e for e in current_entries(claim, driver)}
    for result in binding_results(claim, driver, pool):
        entry = entries.get(_key(_entry(driver, result))) or {}
        true = {
            c.get("type")
            for c in entry.get("conditions") or []
            if isinstance(c, Mapping) and c.get("status") == "True"
        }
        failed = bool(true & set(result.get("bindingFailureConditions") or []))
        if not failed and not set(result.get("bindingConditions") or []) <= true:
            return False
    return True


def binding_entries(
    driver: str,
    pool: str,
    claim: Mapping[str, Any],
    made: Mapping[str, Mapping[str, Any]] | None,
    error: str,
    now: str,
) -> list[dict[str, Any]]:
    """The entries of the devices the scheduler waits on: with `made` (device name -> its
    data), each of the device's binding conditions True, reason SliceMade; without, its first
    failure condition True, reason SliceCreateFailed, `error` the message (the scheduler
    fails the binding and puts the pod back in its queue)."""
    generation = (claim.get("metadata") or {}).get("generation")
    out = []
    for result in binding_results(claim, driver, pool):
        entry = _entry(driver, result)
        data = made.get(str(result.get("device"))) if made is not None else None
        if data is not None:
            types, reason, message = result["bindingConditions"], BOUND_REASON, describe(data)
            entry["data"] = dict(data)
        else:
            failures = result.get("bindingFailureConditions") or []
            if not failures:
                continue  # nothing to say that the scheduler would hear: it times out
            types = failures[:1]
            reason = BIND_FAILED_REASON
            message = error if made is None else f"{result.get('device')} was not made"
        entry["conditions"] = [
            {**_condition(True, reason, message, generation, now), "type": str(t)} for t in types
        ]
        out.append(entry)
    return out


def with_condition(
    claim: Mapping[str, Any], driver: str, device: str, condition: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """The claim's whole status.devices with `condition` (by its type) on this driver's entries
    of `device`, keeping its lastTransitionTime where its status is the same; None when
    nothing changes or the claim has no entry of that device (not prepared here)."""
    out, changed, found = [], False, False
    for e in (claim.get("status") or {}).get("devices") or []:
        if not isinstance(e, Mapping):
            continue
        entry = dict(e)
        if entry.get("driver") == driver and entry.get("device") == device:
            found = True
            kept = [c for c in entry.get("conditions") or [] if isinstance(c, Mapping)]
            old = next((c for c in kept if c.get("type") == condition["type"]), None)
            new = dict(condition)
            if old is not None and old.get("status") == new.get("status"):
                new["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
            if old != new:
                changed = True
                entry["conditions"] = [c for c in kept if c.get("type") != new["type"]] + [new]
        out.append(entry)
    return out if found and changed else None


def share_condition(
    ok: bool, reason: str, message: str, generation: Any, now: str, kind: str
) -> dict[str, Any]:
    """The share watch's condition (nodeagent.dra.watch): type `kind`, True while within."""
    return {**_condition(ok, reason, message, generation, now), "type": kind}
