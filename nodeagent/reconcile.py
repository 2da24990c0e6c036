"""The reconcile pipeline: one straight list of named steps, run on one worker.

    observe  read every GPU into a new Snapshot (and which devices pods hold)
    desire   what is wanted: the MIG config name (settings, or the node label
             nvidia.com/mig.config) and its file (parsed again only when it changed), MPS;
             with none named and a workload file set, the sharing config planned from it
    resolve  per GPU: the MIG state the config asks for, and the MPS daemon (GPUs, limits);
             MIG on a GPU under MPS (and MPS on a GPU that will have MIG) is refused here
    plan     the fewest NVML operations (pure), and the one MPS change
    pause    only when a MIG operation is planned: report "pending", run the apply-start
             hook, pause the GPU clients, run the pre-apply-mode / pre-apply-config hooks
    apply    under the node-wide MIG writer lock and the NVML lock: read again, plan again,
             execute; then converge the MPS daemon
    verify   read again; the GPUs must match the config, the MPS limits must read back
    restore  the apply-exit hook, then GPU clients back (always, whatever failed after the
             apply-start hook ran or the clients were paused)
    publish  labels to every sink, all from the one snapshot the run ends with
    report   state label, reason annotation and Events (node label protocol), metrics,
             readiness

Nothing changes before resolve and plan succeeded for the whole node. Every failure is
reported as `<step>: <reason>` (`resolve: mig.yaml: no config named 'x'`), and each step's
duration is a sample of `nodeagent_reconcile_step_duration_seconds{step}`. Collaborators come
in as arguments, so the whole pipeline runs in a unit test on the emulator with fakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nodeagent.configfile import ConfigCache
from nodeagent.errors import AgentError, ConfigError, KubeError, MigError
from nodeagent.files import atomic_write_text
from nodeagent.hooks import HooksFile, load_hooks, run_hook
from nodeagent.labels.machine import gfd_options
from nodeagent.labels.plugin import plugin_config
from nodeagent.labels.render import SharingState, render_labels
from nodeagent.logs import get_logger
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.apply import Reset, execute
from nodeagent.mig.config import MigConfigFile, load_config
from nodeagent.mig.plan import Plan, mismatches, plan
from nodeagent.mig.select import Desired, resolve
from nodeagent.mps.manager import MpsChange, MpsIntent, MpsManager
from nodeagent.mps.settings import validate
from nodeagent.nvml import Inventory, MigWriter
from nodeagent.plan.hook import PLANNED, WorkloadPlanner
from nodeagent.settings import Settings, mps_daemon_settings
from nodeagent.sharing.config import SharingFile, load_sharing_file
from nodeagent.sharing.resolve import Resolution, resolve_sharing
from nodeagent.snapshot import Allocations, Snapshot, Store

log = get_logger("nodeagent.reconcile")
STEPS = (
    "observe",
    "desire",
    "resolve",
    "plan",
    "pause",
    "apply",
    "verify",
    "restore",
    "publish",
    "report",
)
# A failure in these steps is the wanted config's failure (state label "failed"); one in
# observe is the node's (retried, nothing reported against the config).
CONFIG_STEPS = frozenset({"desire", "resolve", "plan", "pause", "apply", "verify", "restore"})


@dataclass(frozen=True)
class Wanted:
    """What a source asks for. `tracked`: the source expects a state report (node label)."""

    origin: str  # "settings" | "node-label"
    mig_config: str | None
    tracked: bool = False
    sharing_config: str | None = None  # a per-GPU sharing config (nodeagent/v1)


class DesireSource(Protocol):
    def wanted(self, settings: Settings) -> Wanted: ...


class SettingsDesire:
    """Bare metal: the MIG config name of the settings (flags, environment, file)."""

    def wanted(self, settings: Settings) -> Wanted:
        return Wanted("settings", settings.mig.config, sharing_config=settings.sharing.config)


class Clients(Protocol):
    def pause(self) -> None: ...
    def restore(self) -> None: ...


class LabelSink(Protocol):
    name: str

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None: ...


@dataclass(frozen=True)
class Report:
    result: str  # success | failure
    wanted: Wanted
    step: str | None = None  # the step that failed
    reason: str | None = None  # "<step>: <error>"
    operations: int = 0  # NVML operations done
    mps_change: str = "none"
    generation: int = 0
    done: tuple[dict[str, Any], ...] = ()  # the NVML operations (planned ones on a dry run)
    sharing: dict[int, tuple[str, int]] = field(default_factory=dict)  # GPU -> (strategy, n)
    error: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def config_failed(self) -> bool:
        return self.step in CONFIG_STEPS


class Reporter(Protocol):
    def changing(self, wanted: Wanted, operations: int) -> None: ...
    def finished(self, report: Report) -> None: ...


@dataclass
class Run:
    """One pass through the pipeline: what each step found, for the next."""

    settings: Settings
    snapshot: Snapshot | None = None
    wanted: Wanted = field(default_factory=lambda: Wanted("settings", None))
    desired: dict[int, Desired] | None = None
    mps_intent: MpsIntent | None = None
    sharing: Resolution | None = None
    mig_plan: Plan = field(default_factory=Plan)
    mps_change: MpsChange = field(default_factory=lambda: MpsChange("none"))
    clients: Clients | None = None
    paused: bool = False
    hooks: HooksFile | None = None
    hooks_started: bool = False  # apply-start ran: apply-exit runs, whatever happens next
    outcome: str = "success"  # what apply-exit is told
    done: list[dict[str, Any]] = field(default_factory=list)
    step: str = ""
    took_ms: dict[str, float] = field(default_factory=dict)  # step -> milliseconds


def refuse_unknown_holders(snapshot: Snapshot, mig_plan: Plan) -> None:
    """A MIG change needs to know which slices pods hold: when the kubelet could not be asked in
    this read, refuse rather than guess from an older answer. Raises KubeError."""
    if snapshot.allocations_error is not None and mig_plan.operations:
        raise KubeError(
            f"cannot tell which slices pods hold ({snapshot.allocations_error}); nothing was"
            " changed"
        )


@dataclass
class Pipeline:
    """The reconcile pipeline. `settings` is read at the start of each run (reload)."""

    store: Store
    settings: Callable[[], Settings]
    desire: DesireSource
    reset: Callable[[Settings], Reset]
    mps: MpsManager
    stats: AgentStats
    writer_lock: Callable[[Settings], AbstractContextManager[None]]
    sinks: list[LabelSink] = field(default_factory=list)
    allocations: Allocations | None = None
    clients: Callable[[Settings], Clients | None] = lambda _s: None
    reporter: Reporter | None = None
    on_published: Callable[[], None] = lambda: None
    configs: ConfigCache[MigConfigFile] = field(
        default_factory=lambda: ConfigCache(load_config, "MIG config file")
    )
    sharing_files: ConfigCache[SharingFile] = field(
        default_factory=lambda: ConfigCache(load_sharing_file, "sharing config file")
    )
    hook_files: ConfigCache[HooksFile] = field(
        default_factory=lambda: ConfigCache(load_hooks, "hooks file")
    )
    workloads: WorkloadPlanner = field(default_factory=WorkloadPlanner)  # sharing.workload-file
    per_gpu: dict[int, tuple[str, int]] = field(default_factory=dict)  # what each GPU offers
    _time_sliced: dict[int, int] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    last_report: Report | None = None
    applying: bool = False  # a MIG change holds the NVML lock: readers wait, by design
    log_failures: bool = True  # a one-shot command says it once, on stderr, itself
    # One run at a time: the reconcile worker, a reload's wake-up and a caller (a test, a
    # one-shot command) must never interleave their steps on the same node.
    _running: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- the run ----------------------------------------------------------------------------

    def run_once(self, dry_run: bool = False) -> Report:
        """Run every step once; returns the report (also kept in `last_report`). Never raises
        for a failing step: the failure is the report. A dry run stops after `plan`: the
        report lists the planned operations and changes nothing. Runs one at a time."""
        with self._running:
            return self._run_once(dry_run)

    def _run_once(self, dry_run: bool) -> Report:
        run = Run(self.settings())
        start = self.clock()
        failure: tuple[str, BaseException] | None = None
        steps: list[tuple[str, Callable[[Run], None]]] = [
            ("observe", self.observe),
            ("desire", self.desire_step),
            ("resolve", self.resolve_step),
            ("plan", self.plan_step),
            ("pause", self.pause),
            ("apply", self.apply),
            ("verify", self.verify),
        ]
        if dry_run:
            steps = steps[: [name for name, _ in steps].index("plan") + 1]
        try:
            for name, step in steps:
                self._step(run, name, step)
        except Exception as err:  # every failure becomes the report, named by its step
            failure = (run.step, err)
        if dry_run:
            if failure is None:
                run.done = [op.to_dict() for op in run.mig_plan.operations]
            return self._report(run, failure)
        if run.paused or run.hooks_started:
            run.outcome = "success" if failure is None else "failure"
            try:
                self._step(run, "restore", self.restore)
            except Exception as err:
                failure = failure or (run.step, err)
        if failure is None or failure[0] not in ("observe",):
            try:
                self._step(run, "publish", self.publish)
            except Exception as err:
                failure = failure or (run.step, err)
        report = self._report(run, failure)
        self._step(run, "report", lambda r: self._send_report(report))
        self.stats.record(report.result, self.clock() - start, time.time())
        self.last_report = report
        return report

    def _step(self, run: Run, name: str, step: Callable[[Run], None]) -> None:
        run.step = name
        began = self.clock()
        log.debug("reconcile.step", step=name)
        try:
            step(run)
        finally:
            seconds = self.clock() - began
            run.took_ms[name] = round(seconds * 1000, 1)
            self.stats.record_step(name, seconds)

    def _report(self, run: Run, failure: tuple[str, BaseException] | None) -> Report:
        generation = run.snapshot.generation if run.snapshot else 0
        ops = len(run.done)
        if failure is None:
            if ops or run.mps_change.action != "none":
                log.info(
                    "reconcile.changed",
                    origin=run.wanted.origin,
                    mig_config=run.wanted.mig_config,
                    sharing_config=run.wanted.sharing_config,
                    operations=ops,
                    mps=run.mps_change.action,
                    steps=run.took_ms,
                )
            return Report(
                "success", run.wanted, None, None, ops, run.mps_change.action, generation,
                tuple(run.done), self._shares(run),
            )  # fmt: skip
        step, err = failure
        text = str(err) if isinstance(err, AgentError) else f"internal error: {err!r}"
        (log.error if self.log_failures else log.debug)(
            "reconcile.failed",
            step=step,
            error=text,
            origin=run.wanted.origin,
            mig_config=run.wanted.mig_config,
            sharing_config=run.wanted.sharing_config,
            steps=run.took_ms,
            exc_info=not isinstance(err, AgentError),
        )
        return Report(
            "failure", run.wanted, step, f"{step}: {text}", ops, run.mps_change.action,
            generation, tuple(run.done), self._shares(run), err,
        )  # fmt: skip

    def _shares(self, run: Run) -> dict[int, tuple[str, int]]:
        """What each GPU offers after this run: the sharing config's intents when one was
        resolved (also on a dry run), else what was published."""
        if run.sharing is not None:
            return {i: (it.strategy, it.replicas) for i, it in sorted(run.sharing.intents.items())}
        return dict(self.per_gpu)

    def _send_report(self, report: Report) -> None:
        if self.reporter is not None:
            try:
                self.reporter.finished(report)
            except AgentError as err:  # the change itself is done (or failed) either way
                log.warning("report.failed", error=str(err))

    # -- the steps ----------------------------------------------------------------------------

    def observe(self, run: Run) -> None:
        run.snapshot = self.store.observe(self.allocations)

    def desire_step(self, run: Run) -> None:
        run.wanted = self.desire.wanted(run.settings)
        s = run.settings
        if s.sharing.workload_file and not (run.wanted.sharing_config or run.wanted.mig_config):
            # No config wanted by name: the one planned from the workload file, applied as a
            # named sharing config is (nodeagent.plan.hook).
            assert run.snapshot is not None
            path = self.workloads.sharing_file(
                s.sharing.workload_file, run.snapshot.inventory, s.node.run_dir
            )
            sharing = dataclasses.replace(s.sharing, config_file=str(path), config=PLANNED)
            run.settings = dataclasses.replace(s, sharing=sharing)
            run.wanted = dataclasses.replace(run.wanted, sharing_config=PLANNED)
        if run.wanted.sharing_config is not None and not run.settings.sharing.config_file:
            raise ConfigError(
                f"sharing config {run.wanted.sharing_config!r} is wanted but no sharing config"
                " file is set (sharing.config-file, --sharing-file)"
            )
        if run.wanted.mig_config is not None and not run.settings.mig.config_file:
            raise ConfigError(
                f"MIG config {run.wanted.mig_config!r} is wanted but no MIG config file is set"
                " (mig.config-file, -f, NODEAGENT_MIG_CONFIG_FILE)"
            )

    def resolve_step(self, run: Run) -> None:
        assert run.snapshot is not None
        inventory = run.snapshot.inventory
        if run.wanted.sharing_config is not None:
            self._resolve_sharing(run, inventory, run.wanted.sharing_config)
            return
        name = run.wanted.mig_config
        if name is not None:
            cfg = self.configs.load(run.settings.mig.config_file)
            run.desired = resolve(cfg, name, inventory)
        run.mps_intent = mps_intent(run.settings, inventory, run.desired, name, self.mps.serving)

    def _resolve_sharing(self, run: Run, inventory: Inventory, name: str) -> None:
        """A sharing config says what each GPU it names becomes: MIG geometry, a place under
        the one MPS daemon (its replicas and thread percentage are daemon-wide), time-slicing
        or whole. The MPS daemon follows the config's MPS GPUs."""
        s = run.settings
        cfg = self.sharing_files.load(s.sharing.config_file)
        mig_file = self.configs.load(s.mig.config_file) if s.mig.config_file else None
        res = resolve_sharing(cfg, name, inventory, mig_file)
        run.sharing, run.desired = res, res.mig
        pinned = ",".join(f"{i}={size}" for i, size in sorted(res.pinned.items())) or None
        share = res.mps
        mps = dataclasses.replace(
            s.mps,
            enabled=bool(res.mps_devices),
            devices=res.mps_devices or None,
            replicas=share.replicas if share else s.mps.replicas,
            thread_percentage=share.thread_percentage if share else None,
            pinned_memory=pinned,
            device_plugin_config=None,  # the sharing config is the source of replicas here
        )
        with_mps = dataclasses.replace(s, mps=mps)
        run.mps_intent = mps_intent(
            with_mps, inventory, run.desired, name, self.mps.serving, moving=True
        )

    def plan_step(self, run: Run) -> None:
        assert run.snapshot is not None
        if run.desired is not None:
            run.mig_plan = plan(run.snapshot.inventory, run.desired, run.snapshot.allocated)
            refuse_unknown_holders(run.snapshot, run.mig_plan)
        run.mps_change = self.mps.plan(run.mps_intent)
        if run.settings.mig.hooks_file:  # a bad file fails here, before anything changes
            run.hooks = self.hook_files.load(run.settings.mig.hooks_file)

    def pause(self, run: Run) -> None:
        if not run.mig_plan.operations:
            return
        if self.reporter is not None:
            self.reporter.changing(run.wanted, len(run.mig_plan.operations))
        self._hook(run, "apply-start")
        run.hooks_started = run.hooks is not None
        run.clients = self.clients(run.settings)
        if run.clients is not None:
            run.paused = True  # before the call: a half-done pause is restored too
            run.clients.pause()
        kinds = {op.op for op in run.mig_plan.operations}
        if "set-mig-mode" in kinds:
            self._hook(run, "pre-apply-mode")
        if kinds - {"set-mig-mode"}:
            self._hook(run, "pre-apply-config")

    def _hook(self, run: Run, name: str) -> None:
        """Run hook `name` of the hooks file, if any (mig-parted's environment variables, and
        the outcome for apply-exit). Raises HookError."""
        if run.hooks is None:
            return
        wanted = run.wanted
        env = {
            "MIG_PARTED_CONFIG_FILE": run.settings.mig.config_file or "",
            "MIG_PARTED_SELECTED_CONFIG": wanted.mig_config or wanted.sharing_config or "",
            "MIG_PARTED_HOOKS_FILE": run.hooks.source,
            "NODEAGENT_HOOK": name,
            "NODEAGENT_MIG_CONFIG": wanted.mig_config or "",
            "NODEAGENT_SHARING_CONFIG": wanted.sharing_config or "",
        }
        if name == "apply-exit":
            env["NODEAGENT_RESULT"] = run.outcome
        if run_hook(run.hooks, name, env, run.settings.mig.hook_timeout_seconds):
            log.info("hook.done", hook=name)

    def apply(self, run: Run) -> None:
        change = run.mps_change
        enabling = {i for i, d in (run.desired or {}).items() if d.mig_enabled}
        if change.action in ("stop", "restart") and enabling & set(self.mps.serving):
            # A GPU leaves MPS for MIG: the daemon lets go of it before MIG is enabled there
            # (the plan refused this already if the daemon has clients).
            self.mps.apply(MpsChange("stop", reason="its GPUs change"))
            change = (
                MpsChange("start", change.intent)
                if change.action == "restart"
                else (MpsChange("none"))
            )
        if run.mig_plan.operations and run.desired is not None:
            with self.writer_lock(run.settings), self.store.session.lock, self._applying():
                # Another writer may have acted between plan and lock: plan again from what
                # NVML says now (cheap), under the lock, and execute that.
                snap = self.store.observe(self.allocations)
                current = plan(snap.inventory, run.desired, snap.allocated)
                refuse_unknown_holders(snap, current)
                run.done = execute(current, MigWriter(self.store.session), self.reset(run.settings))
        if change.action != "none":
            if run.done and change.intent is not None:  # validated against the GPUs as now
                snap = self.store.observe(self.allocations)
                validate(change.intent.settings, snap.inventory)
            self.mps.apply(change)

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        self.applying = True
        try:
            yield
        finally:
            self.applying = False

    def verify(self, run: Run) -> None:
        if run.done:
            run.snapshot = self.store.observe(self.allocations)
        assert run.snapshot is not None
        if run.desired is not None:
            problems = mismatches(run.snapshot.inventory, run.desired)
            if problems:
                raise MigError("the GPUs do not match the config: " + "; ".join(problems))
        if run.mps_intent is not None:
            self.mps.verify()

    def restore(self, run: Run) -> None:
        """apply-exit (once apply-start ran), then the clients back; both are tried."""
        errors: list[AgentError] = []
        if run.hooks_started:
            run.hooks_started = False
            try:
                self._hook(run, "apply-exit")
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

    def publish(self, run: Run) -> None:
        snap = self.store.snapshot
        if snap is None:
            return
        self.per_gpu = self._offers(snap.inventory, run)
        labels = render_labels(
            snap.inventory,
            self.sharing(),
            run.settings.labels.prefix,
            self.per_gpu,
            gfd_options(run.settings.labels),
        )
        out = run.settings.sharing.plugin_config_out
        if out is not None:
            self._write_plugin_config(out)
        errors = []
        for sink in self.sinks:
            try:
                sink.publish(labels, snap)
            except AgentError as err:  # one sink failing does not keep the others stale
                errors.append(f"{sink.name}: {err}")
        self.on_published()
        if errors:
            raise AgentError("; ".join(errors))

    def _offers(self, inventory: Inventory, run: Run) -> dict[int, tuple[str, int]]:
        """What each GPU offers now: MIG (from NVML), MPS (the daemon's GPUs), time-slicing
        (the sharing config: nothing on the GPU says so), or whole."""
        if run.sharing is not None:
            self._time_sliced = {
                i: it.replicas for i, it in run.sharing.intents.items()
                if it.strategy == "time-slicing"
            }  # fmt: skip
        elif run.wanted.sharing_config is None and run.step != "observe":
            self._time_sliced = {}
        daemon = self.mps.daemon
        serving = set(self.mps.serving)
        offers: dict[int, tuple[str, int]] = {}
        for gpu in inventory.gpus:
            i = gpu.index
            if gpu.mig_current:
                offers[i] = ("mig", 1)
            elif i in serving and daemon is not None:
                offers[i] = ("mps", daemon.settings.replicas)
            elif i in self._time_sliced:
                offers[i] = ("time-slicing", self._time_sliced[i])
            else:
                offers[i] = ("whole", 1)
        return offers

    def _write_plugin_config(self, path: Path) -> None:
        import yaml

        document, warnings = plugin_config(self.per_gpu)
        for warning in warnings:
            log.warning("sharing.plugin_config", limitation=warning)
        text = yaml.safe_dump(document, sort_keys=False)
        try:
            if path.exists() and path.read_text() == text:
                return
            atomic_write_text(path, text, mode=0o644)
        except OSError as err:
            raise AgentError(
                f"cannot write the device plugin config {path}: {err.strerror}"
            ) from err
        log.info("sharing.plugin_config.written", path=str(path))

    def sharing(self) -> SharingState:
        status = self.mps.status
        if status is not None and status.running and self.mps.daemon is not None:
            return SharingState("mps", self.mps.daemon.settings.replicas)
        return SharingState()


# -- MPS intent (pure) ------------------------------------------------------------------


def _final_mig(inventory: Inventory, desired: Mapping[int, Desired] | None) -> dict[int, bool]:
    """Per GPU: will MIG be enabled once the wanted config is applied?"""
    out = {}
    for gpu in inventory.gpus:
        wanted = desired.get(gpu.index) if desired else None
        out[gpu.index] = wanted.mig_enabled if wanted else gpu.mig_current or gpu.mig_pending
    return out


def mps_intent(
    settings: Settings,
    inventory: Inventory,
    desired: Mapping[int, Desired] | None,
    mig_config: str | None,
    serving: tuple[int, ...] = (),
    moving: bool = False,
) -> MpsIntent | None:
    """The MPS daemon the node should run, validated against the GPUs as the MIG config will
    leave them. Raises ConfigError when MIG and MPS would meet on a GPU."""
    final = _final_mig(inventory, desired)
    what = f"MIG config {mig_config!r}" if mig_config else "MIG"
    # A sharing config that moves a GPU from MPS to MIG moves MPS first (`moving`); a MIG
    # config alone never takes a GPU from the daemon.
    problems = [
        f"{what} enables MIG on GPU {i}, which the running MPS daemon serves; stop MPS on it"
        " first (mps.devices) or pick a config that leaves it whole"
        for i in serving
        if desired and i in desired and desired[i].mig_enabled and not moving
    ]
    mps = settings.mps
    if not mps.enabled:
        if problems:
            raise ConfigError("; ".join(problems))
        return None
    devices = mps.devices or tuple(i for i, mig in sorted(final.items()) if not mig)
    problems += [
        f"{what} enables MIG on GPU {i}, which mps.devices puts under MPS"
        for i in devices
        if final.get(i) and i not in serving and desired and i in desired
    ]
    if not devices and not problems:
        problems.append("MPS is enabled but every GPU has MIG enabled; no GPU is left for MPS")
    if problems:
        raise ConfigError("; ".join(problems))
    as_planned = dataclasses.replace(
        inventory,
        gpus=tuple(
            dataclasses.replace(g, mig_current=final[g.index], mig_pending=final[g.index])
            for g in inventory.gpus
        ),
    )
    daemon = mps_daemon_settings(mps, devices, settings.kube.enabled)
    return MpsIntent(daemon, validate(daemon, as_planned))


@contextlib.contextmanager
def no_lock(_settings: Settings) -> Iterator[None]:
    yield
