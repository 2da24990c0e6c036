"""The latest values the collectors read. Samplers replace them whole; a scrape never waits."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeagent.nvml.inventory import Inventory


@dataclass(frozen=True)
class Telemetry:
    """Per-GPU values read with the inventory that are not part of it."""

    utilization: dict[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class GpmValues:
    """GPM ratios (0-1) by metric name, per GPU and per (GPU, GPU instance id)."""

    by_gpu: dict[int, dict[str, float]] = field(default_factory=dict)
    by_gi: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)


class Store:
    """Holds immutable snapshots; each attribute is replaced in one assignment, so a reader
    always sees a consistent snapshot without locks."""

    def __init__(self) -> None:
        self.inventory: Inventory | None = None
        self.inventory_time: float = 0.0
        self.telemetry = Telemetry()
        self.gpm = GpmValues()
        self.allocated: dict[str, str] = {}  # device UUID -> the pod holding it (kubelet)

    def publish(self, inventory: Inventory, telemetry: Telemetry, when: float) -> None:
        self.telemetry = telemetry
        self.inventory = inventory
        self.inventory_time = when
