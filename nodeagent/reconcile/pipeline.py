"""The reconcile pipeline: run_once() runs the named steps (nodeagent.reconcile) in order and
turns the first failure into the report; run_change() runs a claim's change through the same
steps, scoped to its GPUs. The changing steps are nodeagent.reconcile.change's."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from nodeagent.base.configfile import ConfigCache
from nodeagent.base.errors import AgentError, ConfigError, MigError
from nodeagent.base.logs import get_logger
from nodeagent.host.hooks import HooksFile, load_hooks
from nodeagent.labels.devicepluginconfig import DevicePluginConfigReader
from nodeagent.labels.machine import gfd_options
from nodeagent.labels.render import SharingState, render_labels
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.apply import Done, Reset
from nodeagent.mig.config import MigConfigFile, load_config
from nodeagent.mig.generate import GeneratedConfigs
from nodeagent.mig.plan import mismatches
from nodeagent.mig.select import covered, resolve
from nodeagent.mps.intent import check_startable, mps_intent
from nodeagent.mps.manager import MpsManager
from nodeagent.planner.hook import PLANNED, WorkloadPlanner, planned_path
from nodeagent.reconcile.change import Changer
from nodeagent.reconcile.claims import ChangeDone, ClaimChange, preparing
from nodeagent.reconcile.ports import (
    Clients,
    DesireSource,
    LabelSink,
    Report,
    Reporter,
    Stops,
    Wanted,
)
from nodeagent.reconcile.report import report_of
from nodeagent.reconcile.run import (
    Run,
    holders,
    lock_wait_left,
    plan_from,
    prepares,
    reheld,
    unheld,
)
from nodeagent.settings import Settings
from nodeagent.sharing.config import SharingFile, load_sharing_file
from nodeagent.sharing.deviceplugin import check_served
from nodeagent.sharing.offers import Offer, Offers, planned_offers
from nodeagent.sharing.resolve import resolve_sharing, sharing_mps
from nodeagent.state.owners import OwnerStore
from nodeagent.state.record import Owners
from nodeagent.state.snapshot import Allocations, Store

log = get_logger("nodeagent.reconcile")
Step = Callable[[Run], None]


def mig_config_cache() -> ConfigCache[MigConfigFile]:
    """The MIG config file, parsed again only when it changed."""
    return ConfigCache(load_config, "MIG config file")


@dataclass
class Pipeline:
    """The reconcile pipeline. `settings` is read at the start of each run (reload). Every
    collaborator comes in here; nothing is assigned after construction."""

    store: Store
    settings: Callable[[], Settings]
    desire: DesireSource
    reset: Callable[[Settings], Reset]
    mps: MpsManager
    stats: AgentStats
    writer_lock: Callable[[Settings], AbstractContextManager[None]]
    sinks: tuple[LabelSink, ...] = ()
    allocations: Allocations | None = None
    clients: Callable[[Settings], Clients | None] = lambda _s: None
    reporter: Reporter | None = None
    on_published: Callable[[], None] = lambda: None
    offers: Offers = field(default_factory=Offers)
    clock: Callable[[], float] = time.monotonic
    log_failures: bool = True  # a one-shot command says it once, on stderr, itself
    one_shot: bool = False  # a command's run: hooks around every run (mig-parted's apply)
    on_operation: Callable[[Done], None] | None = None  # each NVML operation done
    configs: ConfigCache[MigConfigFile] = field(default_factory=lambda: mig_config_cache())
    owners: OwnerStore | None = None  # the node's ownership record (nodeagent.state.owners)
    stops: Stops | None = None  # a command's stop signals (the agent's stop): see Changer
    last_report: Report | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.sharing_files = ConfigCache[SharingFile](load_sharing_file, "sharing config file")
        self.hook_files = ConfigCache[HooksFile](load_hooks, "hooks file")
        self.plugin_configs = DevicePluginConfigReader()  # labels.device-plugin-config-*
        self.workloads = WorkloadPlanner()  # sharing.workload-file
        self.generated = GeneratedConfigs()  # the MIG configs when no file is given
        self.change = Changer(
            self.store, self.mps, self.reset, self.writer_lock, self.allocations,
            self.clients, self.reporter, self.on_operation, self.one_shot, self.owners,
            self.stops,
        )  # fmt: skip
        # One run at a time: the reconcile worker, a reload's wake-up and a caller (a test, a
        # one-shot command) must never interleave their steps on the same node.
        self._running = threading.Lock()

    @property
    def per_gpu(self) -> dict[int, Offer]:
        """What each GPU offers, as last published."""
        return self.offers.per_gpu

    @property
    def applying(self) -> bool:
        return self.change.applying

    def run_change(self, change: ClaimChange) -> ChangeDone:
        """A claim's change of the GPUs (the DRA driver's, nodeagent.reconcile.claims), run
        as a run of its own with the change as its scope, through the same step functions as
        a MIG config, with the ownership record the driver read when the change began. A claim
        to prepare: pause (the MIG writer lock, within the change's deadline), observe, plan
        (against the record as it is then, the claim written `preparing` when the plan holds:
        one read-modify-write), apply (apply-start and pre-apply-* around operations; the
        plan executed), verify, cdi, restore (apply-exit). A claim let go: observe, plan,
        pause (the lock only when there are operations), apply (the record and the GPUs read
        again, planned again), verify (the claim recorded holding nothing), cdi, restore.
        Returns what it did. Raises the failing step's error (SliceInUse, GeometryInvalid,
        LockHeld, NvmlError, HookError, MigError, KubeError, ConfigError), logged with the
        step's name; nothing is changed when it fails before apply.

        It does not take the run lock: a change waits only for the MIG writer lock, so a claim
        is never queued behind a whole reconcile run (whose apply plans again under that lock,
        seeing the claim's slice as held)."""
        owners = change.read
        if owners is None:
            owners = self.owners.read() if self.owners is not None else Owners()
        run = Run(self.settings(), wanted=Wanted("edge", None), scope=change, owners=owners)
        try:
            for name, step in self._claim_steps(change):
                self.step(run, name, step)
        except Exception as err:
            log.warning(
                "change.failed",
                change=change.name,
                step=run.step,
                error=str(err),
                steps=run.took_ms,
            )
            run.outcome = "failure"
            raise
        finally:
            try:
                if run.hooks_started:
                    self.step(run, "restore", self.change.restore)
            finally:
                self.observed(run)  # first: whatever closing the locks raises
                run.locks.close()
        if run.done:
            log.info("change.done", change=change.name, operations=len(run.done), steps=run.took_ms)
        assert run.snapshot is not None and run.scope is not None
        return ChangeDone(
            tuple(run.done), run.snapshot.inventory, run.lock_wait_seconds, run.scope.claim
        )

    # -- the run ----------------------------------------------------------------------------

    def run_once(self, dry_run: bool = False, compare: bool = False) -> Report:
        """Run every step once; returns the report (also kept in `last_report`). Never raises
        for a failing step: the failure is the report. A dry run stops after `plan`: the report
        lists the planned operations (and, for a MIG config, how the GPUs differ from it) and
        changes nothing. `compare` (an assert) is a dry run that does not ask whether the
        change could start (the MPS control program). Runs one at a time."""
        with self._running:
            run = Run(self.settings())
            try:
                return self._run_once(run, dry_run or compare, compare)
            finally:
                self.observed(run)  # first: whatever closing the locks raises
                run.locks.close()
                self.store.publish_mps(self.mps.status)  # the metrics' MPS status

    def _run_once(self, run: Run, dry_run: bool, compare: bool) -> Report:
        start = self.clock()
        failure: tuple[str, BaseException] | None = None
        steps: list[tuple[str, Step]] = [
            ("observe", self.observe),
            ("desire", self.desire_step),
            ("resolve", self.resolve_step),
            ("plan", lambda r: self.plan_step(r, compare)),
        ]
        if not dry_run:
            steps += self._changing_steps()
        try:
            for name, step in steps:
                self.step(run, name, step)
        except Exception as err:  # every failure becomes the report, named by its step
            failure = (run.step, err)
        if dry_run:
            return report_of(run, failure, self.per_gpu, self.log_failures, dry_run=True)
        if run.paused or run.hooks_started:
            run.outcome = "success" if failure is None else "failure"
            try:
                self.step(run, "restore", self.change.restore)
            except Exception as err:
                failure = failure or (run.step, err)
        run.locks.close()  # the MIG writer lock, once the clients are back
        run.failed = failure is not None
        if failure is None or failure[0] != "observe":
            try:
                self.step(run, "publish", self.publish)
            except Exception as err:
                failure = failure or (run.step, err)
        report = report_of(run, failure, self.per_gpu, self.log_failures)
        sent: list[bool] = []
        self.step(run, "report", lambda r: sent.append(self._send_report(report)))
        if report.reboot_required and run.settings.mig.with_reboot and all(sent):
            report = self._reboot(run, report)
        self.stats.observe_run(report.result, self.clock() - start, time.time())
        self.last_report = report
        return report

    def _claim_steps(self, change: ClaimChange) -> list[tuple[str, Step]]:
        """A claim let go plans before it takes the lock (one that plans nothing takes none),
        and plans again under it; a claim to prepare always takes the lock, and plans once,
        under it, its hooks run around its operations in apply."""
        planning: list[tuple[str, Step]] = [("observe", self.observe), ("plan", self.plan_step)]
        pause, *changing = self._changing_steps()
        if change.release:
            return [*planning, pause, *changing]
        return [pause, *planning, *changing]

    def _changing_steps(self) -> list[tuple[str, Step]]:
        """The steps that change the node, for a MIG config and a claim's change alike."""
        return [
            ("pause", self.change.pause),
            ("apply", self.change.apply),
            ("verify", self.verify),
            ("cdi", self.change.refresh_cdi),
        ]

    def step(self, run: Run, name: str, step: Step) -> None:
        """Run one named step, its duration kept in the run: the step metric takes the run's
        durations once the run ends (`observed`), and the run's last log line and its report
        name them, so a step calls nothing beside its own work."""
        run.step = name
        began = self.clock()
        try:
            step(run)
        finally:
            run.took.append((name, self.clock() - began))

    def observed(self, run: Run) -> None:
        """The run's step durations into the step metric and one debug line (once, as the run
        ends: a failure's warning names the step it failed in)."""
        if run.took:
            log.debug("reconcile.steps", steps=run.took_ms)
        for name, seconds in run.took:
            self.stats.observe_step(name, seconds)

    def _send_report(self, report: Report) -> bool:
        """Whether the reporter took the report (the state label was written)."""
        if self.reporter is not None:
            try:
                self.reporter.finished(report)
            except AgentError as err:  # the change itself is done (or failed) either way
                log.warning("report.failed", error=str(err))
                return False
        return True

    def _reboot(self, run: Run, report: Report) -> Report:
        """mig.with-reboot (nodeagent.reconcile.change.Changer.reboot); a reboot command that
        fails is the config's failure (state `failed`, its reason)."""
        try:
            self.step(run, "reboot", lambda r: self.change.reboot(r, report))
        except AgentError as err:
            failed = report_of(run, ("reboot", err), self.per_gpu, self.log_failures)
            self._send_report(failed)
            return failed
        return report

    # -- the steps ----------------------------------------------------------------------------

    def observe(self, run: Run) -> None:
        """Read the GPUs and who holds them (a claim's change: the claims as in the record it
        carries)."""
        run.snapshot = self.store.observe(holders(run, self.allocations))

    def desire_step(self, run: Run) -> None:
        run.wanted = self.desire.wanted(run.settings)
        s = run.settings
        if s.sharing.workload_file and not (run.wanted.sharing_config or run.wanted.mig_config):
            # No config wanted by name: the one planned from the workload file, applied as a
            # named sharing config is (nodeagent.planner.hook).
            assert run.snapshot is not None
            path = self.workloads.sharing_file(
                s.sharing.workload_file, run.snapshot.inventory, planned_path(s.node)
            )
            sharing = dataclasses.replace(s.sharing, config_file=str(path), config=PLANNED)
            run.settings = dataclasses.replace(s, sharing=sharing)
            run.wanted = dataclasses.replace(run.wanted, sharing_config=PLANNED)
        if run.wanted.sharing_config is not None and not run.settings.sharing.config_file:
            raise ConfigError(
                f"sharing config {run.wanted.sharing_config!r} is wanted but no sharing config"
                " file is set (sharing.config-file, --sharing-file)"
            )

    def resolve_step(self, run: Run) -> None:
        """Per GPU: the MIG state the config asks for, and the MPS daemon. A sharing config
        says what each GPU it names becomes; the MPS daemon follows its MPS GPUs."""
        assert run.snapshot is not None
        inventory, s = run.snapshot.inventory, run.settings
        serving = self.mps.serving
        if run.wanted.sharing_config is not None:
            sharing_name = run.wanted.sharing_config
            cfg = self.sharing_files.load(s.sharing.config_file)
            mig_file = self.configs.load(s.mig.config_file) if s.mig.config_file else None
            run.sharing = resolve_sharing(cfg, sharing_name, inventory, mig_file)
            run.desired = run.sharing.mig
            with_mps = dataclasses.replace(s, mps=sharing_mps(s.mps, run.sharing))
            run.mps_intent = mps_intent(
                with_mps, inventory, run.desired, sharing_name, serving, moving=True
            )
            return
        name = run.wanted.mig_config
        if name is not None:
            # No file given: the configs generated from the GPUs (mig-manager since v0.14.0).
            mig_file = (
                self.configs.load(s.mig.config_file)
                if s.mig.config_file
                else self.generated.load(inventory)
            )
            run.desired = resolve(mig_file, name, inventory)
            selected = covered(mig_file, name, inventory)
            run.uncovered = [
                f"GPU {g.index} ({g.name}): config {name!r} does not specify it"
                for g in inventory.gpus
                if g.index not in selected
            ]
        run.mps_intent = mps_intent(s, inventory, run.desired, name, serving)

    def plan_step(self, run: Run, compare: bool = False) -> None:
        """The fewest NVML operations and the one MPS change; then every prerequisite of the
        change (the hooks file, what an MPS start needs), so a run that cannot finish fails
        here, before anything changed."""
        assert run.snapshot is not None
        if prepares(run) is not None and self.owners is not None:
            # Under the MIG writer lock: planned with the record as it is now, and the claim
            # written into it (`preparing`) when the plan holds, in one read-modify-write.
            run.owners = self.owners.update(
                lambda o: self._claim_plan(run, o),
                wait_seconds=lock_wait_left(run),
                waited=run.lock_wait_seconds,
            )
            return
        if run.desired is not None or run.scope is not None:
            run.mig_plan = plan_from(run, unheld(run.snapshot) if compare else run.snapshot)
        if run.scope is not None:
            self._claim_hooks(run)
            return
        run.mps_change = self.mps.plan(run.mps_intent)
        self._check_served(run)
        if run.settings.mig.hooks_file:  # a bad file fails here, before anything changes
            run.hooks = self.hook_files.load(run.settings.mig.hooks_file)
        if not compare:
            check_startable(run.mps_change)

    def _claim_plan(self, run: Run, owners: Owners) -> Owners:
        """A claim's plan from the GPUs as observed and the record as `owners` has it now
        (the claims recorded since the change began hold their devices too). Raises as
        plan_from does, ConfigError (the hooks file); returns the record with the claim in it
        as planned (`preparing`, its devices settled)."""
        assert run.snapshot is not None and run.scope is not None
        run.owners = owners
        run.mig_plan = plan_from(run, reheld(run, run.snapshot, self.allocations))
        self._claim_hooks(run)
        return preparing(run.scope, owners)

    def _claim_hooks(self, run: Run) -> None:
        """A claim's change: the MIG layout of its GPUs only (no MPS daemon, no offer of the
        device plugin's); a hooks file matters only when it changes a GPU."""
        if run.settings.mig.hooks_file and run.mig_plan.operations:
            run.hooks = self.hook_files.load(run.settings.mig.hooks_file)

    def _check_served(self, run: Run) -> None:
        """Where NVIDIA's device plugin serves the node, it must be able to advertise what
        each GPU will offer after this run (nodeagent.sharing.deviceplugin); else ConfigError."""
        assert run.snapshot is not None
        daemon = run.mps_intent.settings if run.mps_intent is not None else None
        offers = planned_offers(
            run.snapshot.inventory,
            run.desired,
            run.sharing.intents if run.sharing is not None else None,
            set(daemon.devices) if daemon is not None else set(),
            daemon.replicas if daemon is not None else 0,
        )
        check_served(offers, run.settings)

    def verify(self, run: Run) -> None:
        """Read again after NVML operations (apply read the GPUs under the lock otherwise); a
        released claim is recorded holding nothing; the GPUs must be as wanted, the MPS
        limits must read back. Raises MigError, MpsError."""
        if run.done:
            run.snapshot = self.store.observe(holders(run, self.allocations))
        assert run.snapshot is not None
        self.change.released(run)
        if run.desired is not None:
            problems = mismatches(run.snapshot.inventory, run.desired)
            if problems:
                what = "are not as wanted" if run.scope is not None else "do not match the config"
                raise MigError(f"the GPUs {what}: " + "; ".join(problems))
        if run.mps_intent is not None:
            self.mps.verify()

    def publish(self, run: Run) -> None:
        """Labels to every sink, all from the one snapshot the run ends with."""
        snap = self.store.snapshot
        if snap is None:
            return
        daemon = self.mps.daemon
        self.offers.update(
            snap.inventory,
            run.sharing.intents if run.sharing is not None and not run.failed else None,
            run.wanted.sharing_config is not None,
            self.mps.serving,
            daemon.settings.replicas if daemon is not None else 0,
        )
        if not self.sinks:  # a command's run: nothing to publish to
            self.on_published()
            return
        # A bad device plugin config fails the step before any sink: every sink keeps the
        # labels last published.
        plugin = self.plugin_configs.read(run.settings.labels, run.wanted.device_plugin_config)
        labels = render_labels(
            snap.inventory,
            self.sharing(),
            run.settings.labels.prefix,
            self.per_gpu,
            gfd_options(run.settings.labels),
            plugin,
        )
        errors = []
        for sink in self.sinks:
            try:
                sink.publish(labels, snap)
            except AgentError as err:  # one sink failing does not keep the others stale
                errors.append(f"{sink.name}: {err}")
        self.on_published()
        if errors:
            raise AgentError("; ".join(errors))

    def sharing(self) -> SharingState:
        status = self.mps.status
        if status is not None and status.running and self.mps.daemon is not None:
            return SharingState("mps", self.mps.daemon.settings.replicas)
        return SharingState()
