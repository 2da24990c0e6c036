"""The pipeline's changing half: pause, apply, restore. Runs only once resolve and plan
succeeded for the whole node and every prerequisite held (nodeagent.reconcile.pipeline), or
once a claim's change (`Run.scope`) planned its GPUs: the same steps, which branch only where
a claim differs (its deadline bounds the wait for the MIG writer lock, the claim is recorded
before the first NVML operation and, let go, after the last, no GPU client is paused, no state
is reported; nodeagent.reconcile.claims)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from nodeagent.base.errors import AgentError, MigError
from nodeagent.base.logs import get_logger
from nodeagent.host.duties import reboot, refresh_cdi
from nodeagent.host.hooks import hook_env, run_hook
from nodeagent.mig.apply import Done, Reset, execute
from nodeagent.mig.plan import Op, Operation
from nodeagent.mps.manager import NO_MPS_CHANGE, MpsChange, MpsManager
from nodeagent.mps.settings import validate
from nodeagent.nvml import MigWriter
from nodeagent.reconcile.claims import released
from nodeagent.reconcile.ports import Clients, Report, Reporter, Stops
from nodeagent.reconcile.run import Run, holders, lock_wait_left, plan_from, prepares
from nodeagent.settings import Settings
from nodeagent.state.owners import OwnerStore, claimed_mps
from nodeagent.state.snapshot import Allocations, Store

log = get_logger("nodeagent.reconcile")


class Changer:
    """Pauses the GPU clients around a MIG change (with the hooks file's hooks), applies the
    MIG plan and the MPS change under the node-wide MIG writer lock, and restores the clients.

    `one_shot`: a command's single run (`mig apply`): as mig-parted's apply, apply-start and
    apply-exit run around every run, not only around a change. `stops`: a command's stop
    signals, held off while it holds the lock, or the agent's stop; the MIG change ends at the
    next operation.
    """

    def __init__(
        self,
        store: Store,
        mps: MpsManager,
        reset: Callable[[Settings], Reset],
        writer_lock: Callable[[Settings], AbstractContextManager[None]],
        allocations: Allocations | None,
        clients: Callable[[Settings], Clients | None],
        reporter: Reporter | None,
        on_operation: Callable[[Done], None] | None,
        one_shot: bool,
        owners: OwnerStore | None = None,
        stops: Stops | None = None,
    ) -> None:
        self.store = store
        self.mps = mps
        self.reset = reset
        self.writer_lock = writer_lock
        self.allocations = allocations
        self.clients = clients
        self.reporter = reporter
        self.on_operation = on_operation
        self.one_shot = one_shot
        self.owners = owners
        self.stops = stops
        self.rebooted = False  # the reboot command ran: once a process
        self.applying = False  # a MIG change holds the NVML lock: readers wait, by design

    def pause(self, run: Run) -> None:
        """Take the MIG writer lock (held until restore ends), then, for a MIG change: report
        "pending", apply-start, pause the clients, pre-apply-mode / pre-apply-config. A
        claim's change runs the hooks only around operations, and pauses no client: only idle
        slices nobody owns change, and pausing the device plugin or the exporters for one claim
        would disturb every other pod."""
        operations = run.mig_plan.operations
        scope = run.scope
        hooks = run.hooks is not None and (bool(operations) or (self.one_shot and scope is None))
        # A claim let go that plans no NVML operation takes no lock: dropping it from the
        # record never endangers a slice, so it never waits behind another writer. But one
        # sharing a MIG slice does: another share let go at the same time may have kept the
        # slice for it, and under the lock the record is read again (the last one destroys it).
        idle_lock = scope is not None and (
            not scope.release or any(d.shared and d.is_mig for d in scope.claim.devices)
        )
        if not (operations or run.mps_change.action != "none" or hooks or idle_lock):
            return
        began = time.monotonic()
        run.locks.enter_context(self.writer_lock(_lock_settings(run)))
        if self.stops is not None:  # released after the lock is (the locks stack unwinds)
            run.locks.enter_context(self.stops.deferred())
        run.locked, run.lock_wait_seconds = True, time.monotonic() - began
        if operations and self.reporter is not None and scope is None:
            self.reporter.changing(run.wanted, len(operations))
        if hooks:
            self.hook(run, "apply-start")
            run.hooks_started = True
        if not operations:
            return
        run.clients = self.clients(run.settings) if scope is None else None
        if run.clients is not None:
            run.paused = True  # before the call: a half-done pause is restored too
            run.clients.pause()
        self.pre_apply_hooks(run, operations)

    def pre_apply_hooks(self, run: Run, operations: Sequence[Operation]) -> None:
        """pre-apply-mode before MIG mode changes, pre-apply-config before slice changes (the
        hooks of mig-parted's hooks file). Raises HookError."""
        kinds = {op.op for op in operations}
        if Op.SET_MIG_MODE in kinds:
            self.hook(run, "pre-apply-mode")
        if kinds - {Op.SET_MIG_MODE}:
            self.hook(run, "pre-apply-config")

    def hook(self, run: Run, name: str) -> None:
        """Run hook `name` of the hooks file, if any. Raises HookError."""
        if run.hooks is None:
            return
        w, s = run.wanted, run.settings
        result = run.outcome if name == "apply-exit" else None
        env = hook_env(name, run.hooks, s.mig.config_file, w.mig_config, w.sharing_config, result)
        if run_hook(run.hooks, name, env, s.mig.hook_timeout_seconds):
            log.info("hook.done", hook=name)

    def apply(self, run: Run) -> None:
        """Apply the plan. A claim to prepare, planned under the lock, runs apply-start,
        pre-apply-mode and pre-apply-config around its operations here (as pause runs them
        for any other change)."""
        operations = run.mig_plan.operations
        if prepares(run) and run.hooks is not None and operations:
            self.hook(run, "apply-start")
            run.hooks_started = True
            self.pre_apply_hooks(run, operations)
        if operations and self.owners is not None and not prepares(run):
            # before the MPS daemon lets go of a GPU, too: the record's path and its lock's,
            # and the lock taken once within the run's wait (held by another: refused here);
            # a claim to prepare writes the record before its first operation instead
            self.owners.check(_lock_settings(run).mig.lock_timeout_seconds, run.lock_wait_seconds)
        change = run.mps_change
        enabling = {i for i, d in (run.desired or {}).items() if d.mig_enabled}
        if change.action in ("stop", "restart") and enabling & set(self.mps.serving):
            # A GPU leaves MPS for MIG: the daemon lets go of it before MIG is enabled there
            # (the plan refused this already if the daemon has clients).
            self.mps.apply(MpsChange("stop", reason="its GPUs change"))
            change = (
                MpsChange("start", change.intent) if change.action == "restart" else NO_MPS_CHANGE
            )
        if run.mig_plan.operations or run.scope is not None:
            self._apply_mig(run)
        if change.action != "none":
            if run.done and change.intent is not None:  # validated against the GPUs as now
                snap = self.store.observe(self.allocations)
                validate(change.intent.settings, snap.inventory)
            self.mps.apply(change, claimed_mps(self.owners))

    def _apply_mig(self, run: Run) -> None:
        """Under the NVML lock (the MIG writer lock held since pause): a claim to prepare was
        planned and recorded `preparing` under the lock already, and executes its plan; any
        other change reads the GPUs again and plans again (another writer may have acted
        between plan and lock; cheap; a claim let go reads the record again: a claim may share
        its slice since), refuses unknown holders and checks that the ownership record can be
        written. Then execute; the config's slices are the config's. A claim let go that
        planned nothing took no lock: one that now needs an operation is refused (MigError),
        nothing changed."""
        with self.store.session.lock, self._applying():
            if prepares(run):
                current = run.mig_plan  # planned and recorded under the lock
            else:
                if run.locked and run.scope is not None and self.owners is not None:
                    run.owners = self.owners.read()
                run.snapshot = snap = self.store.observe(holders(run, self.allocations))
                current = plan_from(run, snap)
            scope = run.scope
            operations = current.operations
            if operations and not run.locked:
                who = scope.name if scope is not None else "the change"
                raise MigError(f"{who}: the GPUs changed while it was planned; try again")
            if operations and self.owners is not None and not prepares(run):
                self.owners.check()  # written after the operations: refused before them
            if operations:
                writer = MigWriter(self.store.session)
                stop = self.stops.requested if self.stops is not None else lambda: 0
                reset = self.reset(run.settings)
                run.done = execute(current, writer, reset, self.on_operation, stop=stop)
                self._own(run)

    def _own(self, run: Run) -> None:
        """The slices a config made are the config's in the ownership record (under the MIG
        writer lock, held since pause)."""
        name = run.wanted.sharing_config or run.wanted.mig_config
        if self.owners is not None and run.done and name is not None:
            wait = _lock_settings(run).mig.lock_timeout_seconds
            self.owners.update(
                lambda o: dataclasses.replace(o, config=name),
                wait_seconds=wait,
                waited=run.lock_wait_seconds,
            )

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        self.applying = True
        try:
            yield
        finally:
            self.applying = False

    def released(self, run: Run) -> None:
        """A claim let go holds nothing in the record once its slices are gone (in verify,
        still under the MIG writer lock when it took it)."""
        scope = run.scope
        if scope is not None and scope.release and self.owners is not None:
            run.owners = self.owners.update(
                lambda o: released(scope.uid, o, scope.claim.driver),
                wait_seconds=lock_wait_left(run),
                waited=run.lock_wait_seconds,
            )

    def refresh_cdi(self, run: Run) -> None:
        """After a MIG change, before success: the CDI specs follow the new MIG devices."""
        if run.done and refresh_cdi(run.settings):
            log.info("cdi.refreshed", commands=len(run.settings.mig.cdi_commands))

    def reboot(self, run: Run, report: Report) -> None:
        """mig.with-reboot, once the state says `rebooting`: reboot the node, once per process
        (a reboot that did not come is not asked for again every run), and only where a reboot
        is remembered across it: the state label of a node-label request, or a command's one
        run (an agent on bare metal would reboot at every boot where the mode stays pending).
        Raises HostDutyError when the reboot command fails."""
        if self.rebooted or not (report.wanted.tracked or self.one_shot):
            log.warning("host.reboot.skipped", reason=report.reason, rebooted=self.rebooted)
            return
        reboot(run.settings)
        self.rebooted = True

    def restore(self, run: Run) -> None:
        """apply-exit (once apply-start ran), then the clients back; both are tried."""
        errors: list[AgentError] = []
        if run.hooks_started:
            run.hooks_started = False
            try:
                self.hook(run, "apply-exit")
            except AgentError as err:
                errors.append(err)
        if run.paused:
            assert run.clients is not None
            run.paused = False
            try:
                run.clients.restore()
            except AgentError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise AgentError("; ".join(str(e) for e in errors))


def _lock_settings(run: Run) -> Settings:
    """The run's settings, the wait for a lock bounded by a claim's deadline (time.monotonic)
    and less what the run waited for the MIG writer lock: one mig.lock-timeout for both the
    writer lock and the record's."""
    s = run.settings
    left = lock_wait_left(run)
    if left == s.mig.lock_timeout_seconds:
        return s
    return dataclasses.replace(s, mig=dataclasses.replace(s.mig, lock_timeout_seconds=left))
