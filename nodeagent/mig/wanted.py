"""A MIG change an edge asks the pipeline for (the DRA driver: a claim's slice made, or the
slices it made destroyed), and the port the pipeline serves it on. The edge says what the GPUs
it names should be, from the GPUs and their holders as they are once the MIG writer lock is
held; the pipeline runs it through the steps of a MIG config, scoped to those GPUs
(nodeagent.reconcile.pipeline `Pipeline.run_change`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from nodeagent.mig.apply import Done
from nodeagent.mig.select import MigTarget
from nodeagent.nvml.inventory import Inventory

# (the GPUs, {device UUID: who holds it}) -> what each GPU the change touches should be
Wants = Callable[[Inventory, Mapping[str, str]], Mapping[int, MigTarget]]


@dataclass(frozen=True)
class WantedChange:
    """`name` says who asks, in logs and errors ("claim speech/asr-0"). `ignore`: a holder
    (as `in_use_view` names it) that does not count as busy for this change (the claim itself).
    `record` runs under the MIG writer lock twice: after planning, before the first NVML
    operation, with the GPUs as planned (done False), and after the operations, with the GPUs
    as they left them (done True); the ownership record is written there. `deadline`
    (time.monotonic) bounds the wait for the MIG writer lock. `lock_when_idle` False: a change
    that plans no NVML operation takes no lock (a claim let go: dropping it from the record
    never endangers a slice, so it never waits behind another writer)."""

    name: str
    wants: Wants
    ignore: str | None = None
    record: Callable[[Inventory, bool], None] | None = None
    deadline: float | None = None
    lock_when_idle: bool = True


@dataclass(frozen=True)
class ChangeDone:
    """What the change did: each NVML operation (with the time it took), the GPUs after it,
    and how long it waited for the MIG writer lock."""

    operations: tuple[Done, ...]
    inventory: Inventory
    lock_wait_seconds: float = 0.0


class MigEngine(Protocol):
    def run_change(self, change: WantedChange) -> ChangeDone: ...
