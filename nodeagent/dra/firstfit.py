"""A model of the scheduler's device allocator over this node's ResourceSlices, for the
benchmark and the tests of the device order. Pure.

kube-scheduler's DRA allocator (k8s.io/dynamic-resource-allocation/structured) walks a pool's
slices and each slice's devices in the order they are published and takes the first device
that matches the request, is not allocated, and whose counters still fit in its counter set
(KEP-4815): first fit. So the order the driver publishes its devices in decides how the node
packs. Here: devices in slice order, each consuming counters from one counter set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.dra.devices import SliceSpec


@dataclass(frozen=True)
class Device:
    name: str
    attributes: Mapping[str, Any]  # name -> plain value (the attribute's string/int/...)
    counter_set: str | None
    consumes: Mapping[str, int]

    @property
    def profile(self) -> str | None:
        value = self.attributes.get("profile")
        return str(value) if value is not None else None

    @property
    def gpu(self) -> int:
        return int(self.attributes["index"])


def _plain(attribute: Mapping[str, Any]) -> Any:
    return next(iter(attribute.values()))


class FirstFit:
    """The allocator's state on one node: counters left per counter set, devices taken."""

    def __init__(self, specs: Iterable[SliceSpec]) -> None:
        self.left: dict[str, dict[str, int]] = {}
        self.devices: list[Device] = []
        for spec in specs:
            for counter_set in spec.spec.get("sharedCounters", ()):
                self.left[counter_set["name"]] = {
                    name: int(c["value"]) for name, c in counter_set["counters"].items()
                }
            for d in spec.spec.get("devices", ()):
                consumes = (d.get("consumesCounters") or [{}])[0]
                self.devices.append(
                    Device(
                        d["name"],
                        {k: _plain(v) for k, v in d.get("attributes", {}).items()},
                        consumes.get("counterSet"),
                        {n: int(c["value"]) for n, c in consumes.get("counters", {}).items()},
                    )
                )
        self.taken: set[str] = set()
        self._by_name = {d.name: d for d in self.devices}

    def fits(self, device: Device) -> bool:
        if device.name in self.taken:
            return False
        if device.counter_set is None:
            return True
        left = self.left[device.counter_set]
        return all(left.get(n, 0) >= v for n, v in device.consumes.items())

    def allocate(self, matches: Callable[[Device], bool]) -> str | None:
        """The first matching device that fits, taken; None when none does."""
        for device in self.devices:
            if matches(device) and self.fits(device):
                self._take(device, -1)
                return device.name
        return None

    def device(self, name: str) -> Device:
        return self._by_name[name]

    def release(self, name: str) -> None:
        self._take(self._by_name[name], +1)

    def _take(self, device: Device, sign: int) -> None:
        if sign < 0:
            self.taken.add(device.name)
        else:
            self.taken.discard(device.name)
        if device.counter_set is not None:
            left = self.left[device.counter_set]
            for n, v in device.consumes.items():
                left[n] += sign * v


def profile_is(name: str) -> Callable[[Device], bool]:
    """A request for one MIG profile ('1g.18gb'), as a DeviceClass selector says it."""
    return lambda d: d.profile == name


def whole_gpu(d: Device) -> bool:
    return d.attributes.get("type") == "gpu"
