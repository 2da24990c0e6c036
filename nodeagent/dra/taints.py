"""Taints on this node's DRA devices for the faults the health sampler found
(nodeagent.state.faults). Pure.

resource.k8s.io/v1 `Device.taints` (KEP-5055, feature gate DRADeviceTaints; kubernetes/api
resource/v1/types.go, DeviceTaint): `key` (a label name), `value` (a label value), `effect`
(NoSchedule, NoExecute or None; the scheduler allocates a tainted device only to a claim that
tolerates the taint, and NoExecute also evicts the pods of claims already allocated it), and
`timeAdded` (set by the API server when absent; nodeagent sends the time the fault was first
seen, so a restart does not rewrite an unchanged taint).

A fault of a whole GPU taints its whole device and every MIG placement device of it (they are
parts of it); a fault of one MIG slice taints that placement's device only: the GPU's other
slices keep serving. One taint per device, `<driver>/unhealthy`, whose value names the faults
("xid-79", "ecc-uncorrected.xid-79").
"""

from __future__ import annotations

import copy
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.dra.devices import SliceSpec, parse_device_name
from nodeagent.state.faults import Fault, FaultKey, fatal

TAINT_NAME = "unhealthy"
MAX_LABEL_VALUE = 63
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"


@dataclass(frozen=True)
class DeviceFault:
    """What is wrong with one device: its fault kinds (sorted), since when (wall time), and the
    taint's effect."""

    kinds: tuple[str, ...]
    since: float
    effect: str

    @property
    def reason(self) -> str:
        """The kinds as one label value: joined by '.', as many whole ones as 63 characters
        hold."""
        text = self.kinds[0][:MAX_LABEL_VALUE]
        for kind in self.kinds[1:]:
            if len(text) + 1 + len(kind) > MAX_LABEL_VALUE:
                break
            text += "." + kind
        return text


def taint_key(driver: str) -> str:
    return f"{driver}/{TAINT_NAME}"


def device_names(slices: Sequence[SliceSpec]) -> list[str]:
    """Every device of `slices`, in the order published."""
    return [d["name"] for s in slices for d in s.spec.get("devices") or ()]


def device_faults(
    slices: Sequence[SliceSpec], faults: Mapping[FaultKey, Fault], fatal_kinds: Collection[str]
) -> dict[str, DeviceFault]:
    """The faulty devices of `slices` by name: a GPU's faults apply to its whole device and to
    each of its MIG devices, a slice's to its placement's device."""
    out: dict[str, DeviceFault] = {}
    if not faults:
        return out
    for name in device_names(slices):
        ref = parse_device_name(name)
        if ref is None:
            continue
        keys = [FaultKey(ref.gpu)]
        if ref.is_mig:
            keys.append(FaultKey(ref.gpu, ref.profile_id, ref.start))
        found = [faults[k] for k in keys if k in faults]
        if not found:
            continue
        kinds = tuple(sorted({k for f in found for k in f.kinds}))
        effect = NO_EXECUTE if fatal(kinds, fatal_kinds) else NO_SCHEDULE
        out[name] = DeviceFault(kinds, min(f.since for f in found), effect)
    return out


def _time(wall: float) -> str:
    """RFC 3339 in seconds, as the API server stores a metav1.Time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def taint(driver: str, fault: DeviceFault) -> dict[str, str]:
    return {
        "key": taint_key(driver),
        "value": fault.reason,
        "effect": fault.effect,
        "timeAdded": _time(fault.since),
    }


def with_taints(
    slices: Sequence[SliceSpec], faulty: Mapping[str, DeviceFault], driver: str
) -> list[SliceSpec]:
    """`slices` with each faulty device tainted; the other devices (and slices without a faulty
    device) are the very same objects."""
    if not faulty:
        return list(slices)
    out = []
    for s in slices:
        devices = s.spec.get("devices") or []
        if not any(d["name"] in faulty for d in devices):
            out.append(s)
            continue
        tainted = []
        for d in devices:
            if d["name"] in faulty:
                d = copy.deepcopy(d)
                d["taints"] = [taint(driver, faulty[d["name"]])]
            tainted.append(d)
        out.append(SliceSpec(s.name, {**s.spec, "devices": tainted}))
    return out
