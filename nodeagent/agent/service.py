"""Wiring only: builds the parts from the settings, runs the supervised workers, answers health.

Workers, each a `Worker` (catches every exception, backs off, keeps a heartbeat):

    refresh     every metrics.refresh-interval: a new Snapshot, health counters and XIDs
                (each worker marks the exposition changed; a scrape renders it)
    gpm         every metrics.gpm-interval: GPM samples per GPU and GPU instance
    reconcile   every reconcile.interval, and at once when woken (node label change, SIGHUP):
                the pipeline (nodeagent.reconcile)
    mps-probe   every mps.probe-interval while MPS is managed: probe, restart with backoff
    kube-watch  with Kubernetes: list and watch this Node

`/healthz` fails when a worker died or went silent, or the GPUs were not read recently;
`/readyz` fails until the first reconcile succeeded and while the last one failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client.registry import CollectorRegistry

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.logs import get_logger
from nodeagent.metrics.agent import AgentStats
from nodeagent.metrics.dra import DraStats
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.server import MetricsServer
from nodeagent.metrics.webconfig import WebConfig, load_web_config
from nodeagent.mps.manager import MpsManager
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import NvmlSession
from nodeagent.reconcile import Pipeline
from nodeagent.settings import Settings, merge_reload
from nodeagent.state.faults import FaultPolicy
from nodeagent.state.owners import OwnerStore
from nodeagent.state.sampling import FieldSampler, GpmSampler, HealthSampler, UtilizationSampler
from nodeagent.state.snapshot import Store
from nodeagent.state.workers import Worker

if TYPE_CHECKING:  # Kubernetes is imported only when asked for
    from nodeagent.agent.factory import KubeParts, NodeEdges
    from nodeagent.dra.k8s.driver import DraDriver
    from nodeagent.kube.controller import NodeWatcher

log = get_logger("nodeagent.agent.service")
STOP_SECONDS = 4.0  # how long stop() waits for idle workers (SIGTERM exits within 5 s)
# The watch workers' own backoff after a failed pass: the informer waits the jittered one.
WATCH_BACKOFF_SECONDS = 1.0
# Workers that wait for the NVML lock during a MIG change.
NVML_READERS = ("refresh", "gpm", "mps-probe", "dra-publish", "dra-bind", "dra-shares")


class Current:
    """The agent's settings now: every part reads them at each use, a reload replaces them."""

    def __init__(self, settings: Settings) -> None:
        self.value = settings

    def __call__(self) -> Settings:
        return self.value


@dataclass(frozen=True)
class AgentParts:
    """Everything an agent runs, wired by nodeagent.agent.factory.build_agent: `clock` dates
    the snapshots, `monotonic` measures every interval; `node` (with Kubernetes) is the
    pipeline's Node ports, connected at start; `stop_nvml_errors` ends the session's reports
    into the store."""

    session: NvmlSession
    settings: Current
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    stop_event: threading.Event
    store: Store
    stats: AgentStats
    dra_stats: DraStats
    gpm: GpmSampler
    health: HealthSampler
    fields: FieldSampler
    utilization: UtilizationSampler
    mps: MpsManager
    supervisor: MpsSupervisor
    owners: OwnerStore
    pipeline: Pipeline
    registry: CollectorRegistry
    exposition: ExpositionCache
    node: NodeEdges | None
    stop_nvml_errors: Callable[[], None]


class Agent:
    """One node's agent, given its parts (nodeagent.agent.factory.build_agent). `start()`
    (workers + HTTP), `reload()`, `stop()`."""

    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts
        self.session = parts.session
        self.clock, self.monotonic = parts.clock, parts.monotonic
        self.stop_event = parts.stop_event
        self.store = parts.store
        self.stats, self.dra_stats = parts.stats, parts.dra_stats
        self.gpm, self.health = parts.gpm, parts.health
        self.fields, self.utilization = parts.fields, parts.utilization
        self.mps, self.supervisor = parts.mps, parts.supervisor
        self.owners = parts.owners
        self.pipeline = parts.pipeline
        self.registry, self.exposition = parts.registry, parts.exposition
        self.workers: dict[str, Worker] = {}
        self.server: MetricsServer | None = None
        self.kube: KubeParts | None = None  # the Node's ports, once connected (start)
        self.reload_pending: str | None = None  # why a SIGHUP's reload waits for a retry

    @property
    def settings(self) -> Settings:
        return self.parts.settings()

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.parts.settings.value = value

    @property
    def watcher(self) -> NodeWatcher | None:
        """The Node's watcher, with Kubernetes once started."""
        return self.kube.watcher if self.kube is not None else None

    @property
    def dra(self) -> DraDriver | None:
        """The DRA kubelet plugin, with --dra once started."""
        return self.kube.dra if self.kube is not None else None

    def held_failure(self) -> str | None:
        """Why a node-label config stays failed, with Kubernetes (nodeagent.kube.controller)."""
        return self.parts.node.failure() if self.parts.node is not None else None

    # -- work ---------------------------------------------------------------------------------

    def refresh(self) -> None:
        self.store.observe(self.pipeline.allocations)
        try:
            self.health.tick()  # health and XIDs with each new snapshot
            self.fields.tick()
            self.utilization.tick()  # per-process utilization of the GPUs without MIG
        finally:
            self.exposition.changed()

    def sample_gpm(self) -> None:
        self.gpm.tick()
        self.exposition.changed()

    def reconcile(self) -> None:
        self.pipeline.run_once()
        self.exposition.changed()

    def probe_mps(self) -> None:
        if self.mps.daemon is None:
            return
        try:
            self.mps.probe(self.supervisor.check_once)
        finally:
            self.store.publish_mps(self.mps.status)  # the metrics' MPS status
        self.exposition.changed()

    # -- Kubernetes (imported only when asked for) ---------------------------------------------

    def _connect(self, node: NodeEdges) -> None:
        """The Node's ports on the API server, then (with --dra) the DRA plugin serving the
        kubelet from now, before the first reconcile."""
        self.kube = node.connect(self.pipeline, self._wake_reconcile)
        if self.kube.dra is not None:
            self.kube.dra.start()
            self._dra_published(self.kube.dra)

    def _dra_published(self, dra: DraDriver) -> None:
        """What the ResourceSlice publisher did so far, for the metrics."""
        self.dra_stats.slices_published(dra.publisher.writes, dra.publisher.counters_dropped)

    def publish_dra(self) -> None:
        """Every dra.health-interval: poll the devices' faults, then publish the ResourceSlices
        (written only when the devices or their taints changed) and the health board."""
        snap, dra = self.store.snapshot, self.dra
        if dra is None or snap is None:
            return
        d = self.settings.dra
        try:
            self.health.poll_faults()
        except AgentError as err:  # the faults known stay; the inventory is published anyway
            log.warning("dra.fault_poll_failed", error=str(err))
        policy = FaultPolicy(d.health_hold_seconds, frozenset(d.ignored_xids))
        try:
            dra.publish(snap.inventory, self.health.faults.active(policy), d.fatal_faults)
        finally:
            self._dra_published(dra)

    def _wake_reconcile(self) -> None:
        worker = self.workers.get("reconcile")
        if worker is not None:
            worker.wake()

    # -- health -------------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        """While a MIG change runs (a mode change, a GPU reset: minutes), the readers wait for
        the NVML lock by design: their silence is not a fault, the reconcile worker's own
        allowance bounds the change."""
        snap = self.store.snapshot
        if snap is None:
            return False, "no GPU inventory read yet"
        applying = self.pipeline.applying
        age = self.clock() - snap.taken_at
        limit = 3 * self.settings.metrics.refresh_interval_seconds + 30
        if age > limit and not applying:
            return False, f"GPU inventory is {age:.0f} s old (limit {limit:.0f} s)"
        waiting = NVML_READERS if applying else ()
        bad = [
            h.reason
            for name, h in ((n, w.health()) for n, w in self.workers.items())
            if not h.ok and name not in waiting
        ]
        return (False, "; ".join(bad)) if bad else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        if self.reload_pending is not None:
            return False, f"settings reload not done (retrying): {self.reload_pending}"
        report = self.pipeline.last_report
        if report is None:
            return False, "first reconcile not done"
        if report.result != "success":
            return False, report.reason or "the last reconcile failed"
        held = self.held_failure()
        if held is not None:  # a node-label config that failed stays failed until changed
            return False, held
        dra = self.dra
        problem = dra.node.problem() if dra is not None else None
        if problem is not None:
            return False, problem
        return True, "ok"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, serve: bool = True) -> None:
        """Listen and serve, reconcile once, start the workers. On any failure, undo what was
        started (an MPS daemon this call started is stopped again) and raise."""
        try:
            if serve:
                m = self.settings.metrics
                web = check_inputs(self.settings).web
                self.server = MetricsServer(
                    m.address, self.exposition.latest, self.healthy, self.ready,
                    web=web, details=m.health_details, cached=self.exposition.fresh,
                )  # fmt: skip
                # Served from now on, with what is known: a first reconcile can take minutes.
                self.server.start()
            if self.parts.node is not None:
                self._connect(self.parts.node)
            self.reconcile()
            self._first_health()
            self._start_workers()
        except BaseException:
            self._shutdown(stop_mps=self.mps.started_by_us, wait_seconds=STOP_SECONDS)
            raise

    def _first_health(self) -> None:
        """Health and the XID watch from the start, not one refresh interval later; a GPU
        fault here is the refresh worker's to retry, not a reason to refuse to start."""
        try:
            self.health.tick()
        except AgentError as err:
            log.warning("health.failed", error=str(err))
        self.exposition.changed()

    def _start_workers(self) -> None:
        # Intervals are read at every wait: a reload takes effect without a restart.
        kube = self.settings.kube
        # Each worker publishes its error count into the store (the metrics read it there).
        worker = partial(Worker, clock=self.monotonic, on_errors=self.store.publish_worker_errors)
        workers = [
            # start() just refreshed and reconciled: those wait one period first.
            worker("refresh", self.refresh, lambda: self.settings.metrics.refresh_interval_seconds,
                   self.stop_event, wait_first=True),
            worker("gpm", self.sample_gpm, lambda: self.settings.metrics.gpm_interval_seconds,
                   self.stop_event),
            worker("reconcile", self.reconcile, lambda: self.settings.reconcile.interval_seconds,
                   self.stop_event, wait_first=True,
                   busy_allowance_seconds=self._reconcile_allowance),
            worker("mps-probe", self.probe_mps, lambda: self.settings.mps.probe_interval_seconds,
                   self.stop_event, wait_first=True),
        ]  # fmt: skip
        dra, watcher = self.dra, self.watcher
        if dra is not None:
            workers.append(
                worker("dra-publish", self.publish_dra,
                       lambda: self.settings.dra.health_interval_seconds, self.stop_event)
            )  # fmt: skip
            from nodeagent.dra.k8s.binding import INTERVAL_SECONDS
            from nodeagent.dra.sharewatch import WATCH_SECONDS

            # The share servers kept up and their clients watched, on their own interval.
            workers.append(
                worker("dra-shares", dra.watch_shares, lambda: WATCH_SECONDS, self.stop_event)
            )

            # The watches' backoff after a failure is their own, jittered (the informer's
            # pause: nodeagent.kube.reconnect); the worker's, the same on every node, stays 1 s.
            # A pass is a watch of watch-timeout, after a pause and a list that retries.
            workers.append(
                worker("dra-bind", dra.bind, lambda: INTERVAL_SECONDS, self.stop_event,
                       busy_allowance_seconds=kube.watch_timeout_seconds * 1.5 + 120,
                       max_backoff_seconds=WATCH_BACKOFF_SECONDS)
            )  # fmt: skip
        if watcher is not None:
            workers.append(
                worker(
                    "kube-watch",
                    watcher.cycle,
                    lambda: 0.0,
                    self.stop_event,
                    busy_allowance_seconds=kube.watch_timeout_seconds * 1.5 + 120,
                    max_backoff_seconds=WATCH_BACKOFF_SECONDS,
                )
            )
        for each in workers:
            self.workers[each.name] = each
            each.start()

    def _reconcile_allowance(self) -> float:
        """How long one reconcile may take before /healthz calls it stuck: waiting for the GPU
        clients and the MIG lock, the change itself, and (with a hooks file) one hook timeout
        for each of the four hooks."""
        s = self.settings
        hooks = 4 * s.mig.hook_timeout_seconds if s.mig.hooks_file else 0.0
        return s.kube.clients_wait_seconds + s.mig.lock_timeout_seconds + hooks + 600

    def reload(self, new: Settings) -> list[str]:
        """Take the hot settings of `new` (restart-only ones keep their old value); wake the
        reconcile worker so that they apply now. Returns the refused (restart-only) keys."""
        merged, refused = merge_reload(self.settings, new)
        for key in refused:
            log.warning("settings.reload.needs_restart", key=key)
        self.settings = merged
        self.reload_pending = None
        self.stats.reload_success = 1.0
        log.info("settings.reloaded", file=new.file, refused=refused)
        for worker in self.workers.values():
            worker.wake()  # new intervals count from now; the reconcile applies at once
        return refused

    def reload_failed(self, err: AgentError, retry_seconds: float | None = None) -> None:
        """A reload refused: for the file's content (the old settings stay), or, with
        `retry_seconds`, by the system (tried again then; not ready meanwhile)."""
        self.stats.reload_success = 0.0
        self.reload_pending = None if retry_seconds is None else str(err)
        log.error("settings.reload.failed", error=str(err), retry_seconds=retry_seconds)
        self.exposition.changed()

    def stop(self) -> None:
        self._shutdown(stop_mps=self.settings.mps.stop_on_exit, wait_seconds=STOP_SECONDS)

    def stopped_cleanly(self) -> bool:
        """Whether every worker thread ended (a thread blocked in a C call at interpreter exit
        can abort the process: the caller then ends it without finalisation)."""
        return not any(w.is_alive() for w in self.workers.values())

    def _shutdown(self, stop_mps: bool, wait_seconds: float) -> None:
        self.stop_event.set()
        for worker in self.workers.values():
            worker.wake()  # out of its wait at once
        dra, watcher = self.dra, self.watcher
        if watcher is not None:
            watcher.api.interrupt()  # out of its blocking read
        if dra is not None:
            dra.api.interrupt()  # the binding watch too
        deadline = time.monotonic() + wait_seconds
        for worker in self.workers.values():
            if worker.is_alive():
                # A reconcile in the middle of a MIG change ends it at the next boundary
                # between NVML calls (the stop event: AgentStops), where one call can take
                # seconds (a mode change); idle workers are only waited briefly.
                busy_apply = worker.name == "reconcile" and self.pipeline.applying
                worker.join(20 if busy_apply else max(deadline - time.monotonic(), 0.05))
        if self.server is not None:
            self.server.stop()
        if dra is not None:
            dra.stop()
        self.mps.shutdown(stop_daemon=stop_mps)
        self.parts.stop_nvml_errors()
        with self.session.lock:
            self.gpm.close()
            self.health.close()


@dataclass(frozen=True)
class Inputs:
    """The files the settings name that `run` reads before it serves, read and checked."""

    web: WebConfig | None


def check_inputs(settings: Settings) -> Inputs:
    """Read and check every file the settings name that `run` needs before it starts: the web
    config (its TLS files), the kubeconfig (its fields and files). The one validation of
    `config check` and `run`: what one passes, the other takes. Raises ConfigError naming
    every problem (one per line)."""
    from nodeagent.kube.kubeconfig import check_kubeconfig

    problems: list[str] = []
    web = None
    m, k = settings.metrics, settings.kube
    try:
        web = load_web_config(m.web_config_file) if m.web_config_file else None
    except ConfigError as err:
        problems.append(str(err))
    if k.enabled and k.kubeconfig and not k.host:
        try:
            check_kubeconfig(k.kubeconfig)
        except ConfigError as err:
            problems.append(str(err))
    if problems:
        raise ConfigError("\n".join(problems))
    return Inputs(web)
