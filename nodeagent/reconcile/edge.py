"""A MIG change an edge asks for (nodeagent.mig.wanted: the DRA driver's claims), run through
the pipeline's own steps: the same planner, MIG writer lock, hooks, executor, verification, CDI
refresh, step metrics and logs as a MIG config, with the steps named as there:

    observe  read the GPUs and who holds what (pods, the ownership record's claims)
    plan     the edge's wanted state of the GPUs it names -> the fewest NVML operations; a
             slice in use in the way refuses the change here, nothing changed
    pause    take the node-wide MIG writer lock (within the change's deadline); with
             operations, the hooks file's apply-start and pre-apply-* hooks. The GPU clients
             are not paused: only idle slices nobody owns change, and pausing the device
             plugin or the exporters for one claim would disturb every other pod
    apply    under the NVML lock: read again, plan again, record the owners, execute
    verify   read again, record the owners as the GPUs now are; the GPUs must be as wanted
    cdi      after a MIG change, with mig.cdi-refresh: the CDI refresh commands
    restore  apply-exit (once apply-start ran)

It does not take the reconcile run's lock: a change waits only for the MIG writer lock, so a
claim is never queued behind a whole reconcile run (whose apply plans again under that lock,
seeing the claim's slice as held).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from nodeagent.base.configfile import ConfigCache
from nodeagent.base.errors import MigError
from nodeagent.base.logs import get_logger
from nodeagent.host.hooks import HooksFile
from nodeagent.mig.apply import Reset, execute
from nodeagent.mig.plan import Plan, mismatches, plan
from nodeagent.mig.wanted import ChangeDone, WantedChange
from nodeagent.nvml import MigWriter
from nodeagent.reconcile.change import Changer
from nodeagent.reconcile.ports import Wanted
from nodeagent.reconcile.run import Run, refuse_unknown_holders
from nodeagent.settings import Settings
from nodeagent.state.snapshot import Allocations, Snapshot, Store, in_use_view

log = get_logger("nodeagent.reconcile")


class Engine(Protocol):
    """What a change uses of the reconcile pipeline (nodeagent.reconcile.pipeline.Pipeline):
    its collaborators and its way of running a named step."""

    @property
    def store(self) -> Store: ...
    @property
    def settings(self) -> Callable[[], Settings]: ...
    @property
    def reset(self) -> Callable[[Settings], Reset]: ...
    @property
    def writer_lock(self) -> Callable[[Settings], AbstractContextManager[None]]: ...
    @property
    def allocations(self) -> Allocations | None: ...
    @property
    def on_operation(self) -> Callable[[dict[str, Any]], None] | None: ...
    @property
    def change(self) -> Changer: ...
    @property
    def hook_files(self) -> ConfigCache[HooksFile]: ...

    def step(self, run: Run, name: str, step: Callable[[Run], None]) -> None: ...


def _held(snap: Snapshot, change: WantedChange) -> dict[str, str]:
    return {k: v for k, v in in_use_view(snap.holders).items() if v != change.ignore}


def _plan(snap: Snapshot, change: WantedChange) -> tuple[Plan, dict[int, Any]]:
    held = _held(snap, change)
    desired = dict(change.wants(snap.inventory, held))
    the_plan = plan(snap.inventory, desired, held)
    refuse_unknown_holders(snap, the_plan)
    return the_plan, desired


def run_change(pipeline: Engine, change: WantedChange) -> ChangeDone:
    """Run `change`; returns what it did. Raises the failing step's error (SliceInUse,
    GeometryInvalid, LockHeld, NvmlError, HookError, MigError, KubeError), logged with the
    step's name; nothing is changed when it fails before apply."""
    run = Run(pipeline.settings())
    run.wanted = Wanted("edge", None)
    timings: list[dict[str, Any]] = []
    state: dict[str, Any] = {}

    def observe(r: Run) -> None:
        r.snapshot = pipeline.store.observe(pipeline.allocations)

    def plan_step(r: Run) -> None:
        assert r.snapshot is not None
        r.mig_plan, r.desired = _plan(r.snapshot, change)
        if r.settings.mig.hooks_file and r.mig_plan.operations:
            r.hooks = pipeline.hook_files.load(r.settings.mig.hooks_file)

    def pause(r: Run) -> None:
        if not (r.mig_plan.operations or change.lock_when_idle):
            return
        s = r.settings
        if change.deadline is not None:
            left = max(0.0, min(s.mig.lock_timeout_seconds, change.deadline - time.monotonic()))
            s = dataclasses.replace(s, mig=dataclasses.replace(s.mig, lock_timeout_seconds=left))
        began = time.monotonic()
        r.held.enter_context(pipeline.writer_lock(s))
        state["lock_wait"] = time.monotonic() - began
        state["locked"] = True
        ops = r.mig_plan.operations
        if r.hooks is not None and ops:
            pipeline.change.hook(r, "apply-start")
            r.hooks_started = True
            pipeline.change.pre_apply_hooks(r, ops)

    def apply(r: Run) -> None:
        with pipeline.store.session.lock:
            snap = pipeline.store.observe(pipeline.allocations)
            current, r.desired = _plan(snap, change)  # another writer may have acted
            if current.operations and not state.get("locked"):
                raise MigError(f"{change.name}: the GPUs changed while it was planned; try again")
            if change.record is not None:
                change.record(snap.inventory, False)
            if current.operations:
                last = [time.monotonic()]

                def done(op: dict[str, Any]) -> None:
                    now = time.monotonic()
                    timings.append({**op, "seconds": now - last[0]})
                    last[0] = now
                    if pipeline.on_operation is not None:
                        pipeline.on_operation(op)

                writer = MigWriter(pipeline.store.session)
                r.done = execute(current, writer, pipeline.reset(r.settings), done)

    def verify(r: Run) -> None:
        r.snapshot = pipeline.store.observe(pipeline.allocations)
        if change.record is not None:  # still under the MIG writer lock
            change.record(r.snapshot.inventory, True)
        problems = mismatches(r.snapshot.inventory, r.desired or {})
        if problems:
            raise MigError("the GPUs are not as wanted: " + "; ".join(problems))

    steps = [
        ("observe", observe),
        ("plan", plan_step),
        ("pause", pause),
        ("apply", apply),
        ("verify", verify),
        ("cdi", pipeline.change.refresh_cdi),
    ]
    try:
        for name, step in steps:
            pipeline.step(run, name, step)
    except Exception as err:
        log.warning("change.failed", change=change.name, step=run.step, error=str(err))
        run.outcome = "failure"
        raise
    finally:
        try:
            if run.hooks_started:
                pipeline.step(run, "restore", pipeline.change.restore)
        finally:
            run.held.close()
    if run.done:
        log.info("change.done", change=change.name, operations=len(run.done))
    assert run.snapshot is not None
    return ChangeDone(tuple(timings), run.snapshot.inventory, state.get("lock_wait", 0.0))
