"""One pass through the pipeline: what each step found, for the next."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

from nodeagent.base.errors import KubeError
from nodeagent.host.hooks import HooksFile
from nodeagent.mig.apply import Done
from nodeagent.mig.plan import NO_PLAN, Plan, plan
from nodeagent.mig.select import MigTarget
from nodeagent.mps.manager import NO_MPS_CHANGE, MpsChange, MpsIntent
from nodeagent.reconcile.claims import ClaimChange, claim_wants, settled
from nodeagent.reconcile.ports import Clients, Wanted
from nodeagent.settings import Settings
from nodeagent.sharing.resolve import Resolution
from nodeagent.state.owners import WithOwners
from nodeagent.state.record import Owners
from nodeagent.state.snapshot import Allocations, Holders, Snapshot, in_use_view


@dataclass
class Run:
    settings: Settings
    snapshot: Snapshot | None = None
    wanted: Wanted = field(default_factory=lambda: Wanted("settings", None))
    # A claim's change (the DRA driver's): only the GPUs its devices need, planned again at
    # every plan (nodeagent.reconcile.claims); no MPS change, no GPU client paused, nothing
    # published. `owners`: the ownership record it plans with, read once when it began and
    # replaced by what the run itself writes to it.
    scope: ClaimChange | None = None
    owners: Owners | None = None
    pods: Holders | None = None  # the pods' answer of the last read of the GPUs
    desired: dict[int, MigTarget] | None = None
    uncovered: list[str] = field(default_factory=list)  # GPUs a MIG config does not select
    mps_intent: MpsIntent | None = None
    sharing: Resolution | None = None
    mig_plan: Plan = NO_PLAN
    mps_change: MpsChange = NO_MPS_CHANGE
    clients: Clients | None = None
    paused: bool = False
    hooks: HooksFile | None = None
    hooks_started: bool = False  # apply-start ran: apply-exit runs, whatever happens next
    outcome: str = "success"  # what apply-exit is told
    done: list[Done] = field(default_factory=list)
    step: str = ""
    failed: bool = False  # a step before publish failed: the sharing taken last still holds
    took: list[tuple[str, float]] = field(default_factory=list)  # (step, seconds), in order
    # The MIG writer lock, from the start of pause to the end of restore.
    locks: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    locked: bool = False  # pause took the MIG writer lock
    lock_wait_seconds: float = 0.0

    @property
    def took_ms(self) -> dict[str, float]:
        """{step: milliseconds} (a step run twice: its last run), for the logs and the report."""
        return {name: round(seconds * 1000, 1) for name, seconds in self.took}


def unheld(snapshot: Snapshot) -> Snapshot:
    """`snapshot` as if no process, pod or claim held a device: what an assert plans with. It
    asks whether the GPUs match a config (a GPU that matches needs no operation, held or not),
    not whether the change could be made now."""
    gpus = tuple(
        dataclasses.replace(g, slices=tuple(dataclasses.replace(s, processes=()) for s in g.slices))
        for g in snapshot.inventory.gpus
    )
    inventory = dataclasses.replace(snapshot.inventory, gpus=gpus)
    return dataclasses.replace(snapshot, inventory=inventory, allocated={}, allocations_error=None)


def holders(run: Run, allocations: Allocations | None) -> Allocations | None:
    """Who holds each device, for the run's reads of the GPUs: a claim's change takes the
    claims from the record it carries, not from the disk again (and keeps the pods' answer:
    `reheld`)."""
    if run.owners is None or not isinstance(allocations, WithOwners):
        return allocations
    owners, source = run.owners, allocations

    def both() -> Holders:
        run.pods = dict(source.pods()) if source.pods is not None else {}
        return source.merged(run.pods, owners, None)

    return both


def reheld(run: Run, snapshot: Snapshot, allocations: Allocations | None) -> Snapshot:
    """`snapshot` with the claims of the record the run carries now (read again since the
    GPUs were): the pods' answer of that read, and the record's claims."""
    if run.owners is None or run.pods is None or not isinstance(allocations, WithOwners):
        return snapshot
    held = allocations.merged(run.pods, run.owners, snapshot.inventory)
    return dataclasses.replace(snapshot, holders=held, allocated=in_use_view(held))


def prepares(run: Run) -> ClaimChange | None:
    """The claim a run prepares (it plans under the MIG writer lock and writes the record
    before its first NVML operation); None for any other run."""
    return run.scope if run.scope is not None and not run.scope.release else None


def lock_wait_left(run: Run) -> float:
    """How long the run may still wait for a lock: one mig.lock-timeout (the run's settings)
    for the MIG writer lock and the record's together, less what the run waited for the
    writer lock, and never past a claim's deadline (time.monotonic)."""
    left = max(0.0, run.settings.mig.lock_timeout_seconds - run.lock_wait_seconds)
    deadline = run.scope.deadline if run.scope is not None else None
    if deadline is not None:
        left = max(0.0, min(left, deadline - time.monotonic()))
    return left


def plan_from(run: Run, snapshot: Snapshot) -> Plan:
    """The fewest NVML operations from the GPUs of `snapshot` to what the run wants, around
    the devices their holders hold. A claim's change (`run.scope`) is planned again from the
    GPUs and holders as they are now and the record it carries (the claim itself not counted as
    a holder). Raises SliceInUse, GeometryInvalid, ConfigError (the claim's refusals),
    KubeError."""
    held = snapshot.allocated
    if run.scope is not None:
        assert run.owners is not None
        run.scope = settled(run.scope, run.owners, snapshot.inventory)
        held = {uuid: who for uuid, who in held.items() if who != run.scope.name}
        run.desired = claim_wants(run.scope, run.owners, snapshot.inventory, held)
    assert run.desired is not None
    the_plan = plan(snapshot.inventory, run.desired, held)
    refuse_unknown_holders(snapshot, the_plan)
    return the_plan


def refuse_unknown_holders(snapshot: Snapshot, mig_plan: Plan) -> None:
    """A MIG change needs to know which slices pods hold: when the kubelet could not be asked in
    this read, refuse rather than guess from an older answer. Raises KubeError."""
    if snapshot.allocations_error is not None and mig_plan.operations:
        raise KubeError(
            f"cannot tell which slices pods hold ({snapshot.allocations_error}); nothing was"
            " changed"
        )
