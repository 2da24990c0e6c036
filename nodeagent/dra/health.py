"""The health of every device the driver publishes, as the kubelet's resource-health stream
(DRAResourceHealth.NodeWatchResources, KEP-4680; served by nodeagent.dra.k8s.server) sends it.

The board is replaced whole at each fault poll (every dra.health-interval): each stream sends
the complete list at once, again at every change, and at least every RESEND_SECONDS (the kubelet
takes a device it has not heard of within its health timeout as Unknown). A device is Unhealthy
exactly while it carries a taint (nodeagent.dra.taints), with the same reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

RESEND_SECONDS = 10.0


@dataclass(frozen=True)
class DeviceHealth:
    device: str
    healthy: bool
    message: str = ""  # why it is unhealthy


@dataclass(frozen=True)
class Reading:
    """The board as one stream message: every device, and when the driver last determined it
    (the wall time of the last poll)."""

    version: int
    devices: tuple[DeviceHealth, ...]
    determined_at: float


class HealthBoard:
    """Thread-safe; streams wait on it for the next change."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self._changed = threading.Condition()
        self._devices: tuple[DeviceHealth, ...] = ()
        self._version = 0
        self._at = 0.0
        self.closed = False

    def update(self, devices: Sequence[str], unhealthy: Mapping[str, str]) -> bool:
        """Every device now (`unhealthy`: device -> why); True when anything changed."""
        new = tuple(DeviceHealth(d, d not in unhealthy, unhealthy.get(d, "")) for d in devices)
        with self._changed:
            self._at = self.wall()
            if new == self._devices:
                return False
            self._devices, self._version = new, self._version + 1
            self._changed.notify_all()
            return True

    def read(self) -> Reading:
        with self._changed:
            return Reading(self._version, self._devices, self._at)

    def wait(self, seen: int, timeout_seconds: float) -> Reading:
        """The board once its version is not `seen` (at once when it already is not), or after
        `timeout_seconds`, or when woken (a stream ending, the board closing)."""
        with self._changed:
            if self._version == seen and not self.closed:
                self._changed.wait(timeout_seconds)
            return Reading(self._version, self._devices, self._at)

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        """Every stream ends."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()
