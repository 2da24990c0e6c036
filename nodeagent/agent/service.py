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

import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import CollectorRegistry

from nodeagent.agent.factory import agent_pipeline
from nodeagent.base.errors import AgentError, ConfigError, KubeError
from nodeagent.base.logs import get_logger
from nodeagent.dra.traces import owner_store, with_api
from nodeagent.labels.nfd import write_features
from nodeagent.metrics.agent import AgentCollector, AgentStats
from nodeagent.metrics.collectorset import CollectorSet
from nodeagent.metrics.dcgm import DcgmExposition
from nodeagent.metrics.dra import DraCollector, DraStats
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.fields import FieldCollector
from nodeagent.metrics.gpus import GpuCollector
from nodeagent.metrics.health import HealthCollector
from nodeagent.metrics.kube import KUBE_REQUESTS, KubeCollector
from nodeagent.metrics.mps import MpsCollector
from nodeagent.metrics.pods import PodCollector
from nodeagent.metrics.server import MetricsServer
from nodeagent.metrics.sharing import SharingCollector
from nodeagent.metrics.slices import SliceCollector
from nodeagent.metrics.utilization import UtilizationCollector
from nodeagent.metrics.webconfig import WebConfig, load_web_config
from nodeagent.mig.apply import Reset
from nodeagent.mps.manager import MpsManager
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.gpm import GpmReader
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.reconcile import Pipeline
from nodeagent.settings import Settings, merge_reload
from nodeagent.state.faultrecord import FaultRecord, record_path
from nodeagent.state.faults import FaultPolicy
from nodeagent.state.owners import inventory_reader, with_owners
from nodeagent.state.sampling import FieldSampler, GpmSampler, HealthSampler, UtilizationSampler
from nodeagent.state.snapshot import Allocations, Snapshot, Store
from nodeagent.state.workers import Worker

log = get_logger("nodeagent.agent.service")
STOP_SECONDS = 4.0  # how long stop() waits for idle workers (SIGTERM exits within 5 s)
# Workers that wait for the NVML lock during a MIG change.
NVML_READERS = ("refresh", "gpm", "mps-probe", "dra-publish", "dra-bind")


class NfdSink:
    """Node Feature Discovery's local source: a features.d file, written when it changes."""

    name = "nfd"

    def __init__(self, settings: Callable[[], Settings]) -> None:
        self.settings = settings

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        path = self.settings().labels.nfd_features_file
        if path is not None and write_features(path, dict(labels)):
            log.info("labels.written", path=str(path))


class Agent:
    """One node's agent. Build it, then `start()` (workers + HTTP), `reload()`, `stop()`."""

    def __init__(
        self,
        session: NvmlSession,
        settings: Settings,
        reset: Callable[[Settings], Reset],
        lock_path: Any = None,
        clock: Callable[[], float] = time.time,
        allocations: Allocations | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.settings = settings
        # Wall time dates the snapshots; `monotonic` is the one clock every worker, the GPM
        # sampler and the pipeline measure intervals with (a test may pass a virtual one).
        self.clock = clock
        self.monotonic = monotonic
        self.stop_event = threading.Event()
        self.store = Store(session, clock)
        self.stats = AgentStats()
        self.dra_stats = DraStats()  # the DRA driver's, with --dra
        self.gpm = GpmSampler(GpmReader(session), self.store, monotonic)
        # The faults that wait for a GPU reset or a node reboot are recorded beside the lock.
        path = record_path(lock_path)
        record = None if path is None else FaultRecord(path)
        self.health = HealthSampler(session, self.store, monotonic, clock, record)
        self.fields = FieldSampler(session, self.store, monotonic)
        self.utilization = UtilizationSampler(session, self.store, clock)
        self.mps = MpsManager(ComputeModeWriter(session))
        self.supervisor = MpsSupervisor()
        self.workers: dict[str, Worker] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            CollectorSet(
                [
                    GpuCollector(self.store),
                    SliceCollector(self.store),
                    PodCollector(self.store),
                    HealthCollector(lambda: self.store.health),
                    FieldCollector(self.store),
                    UtilizationCollector(self.store),
                    AgentCollector(
                        self.stats,
                        self.store,
                        session.error_counts,
                        lambda: {n: w.errors for n, w in self.workers.items()},
                    ),
                    MpsCollector(lambda: self.mps.status),
                    SharingCollector(lambda: self.pipeline.per_gpu),
                    # with --kube / --dra only: the golden expositions of an agent without
                    # them stay
                    *([KubeCollector(KUBE_REQUESTS)] if settings.kube.enabled else []),
                    *(
                        [DraCollector(self.dra_stats, lambda: self.dra and self.dra.publisher)]
                        if settings.dra.enabled
                        else []
                    ),
                ]
            )
        )
        self.dcgm = DcgmExposition(
            self.store,
            settings.kube.node_name or socket.gethostname(),
            lambda: self.settings.metrics.dcgm_compat,
        )
        self.exposition = ExpositionCache(self.registry, self.dcgm.render)
        self.server: MetricsServer | None = None
        self.watcher: Any = None  # kube.controller.NodeWatcher with Kubernetes
        self.dra: Any = None  # kube.dra_plugin.DraPlugin with --dra
        self.held_failure: Callable[[], str | None] = lambda: None
        self.reload_pending: str | None = None  # why a SIGHUP's reload waits for a retry

        self._reset, self._lock_path, self._allocations = reset, lock_path, allocations
        # Who owns each slice, read by every path that changes MIG (nodeagent.state.owners).
        self.owners = owner_store(self.session, self.settings.dra, lock_path)
        self.pipeline = self._pipeline()

    def _pipeline(self, **kube: Any) -> Pipeline:
        """The reconcile pipeline, with the Kubernetes ports when given (`_setup_kube`)."""
        sinks = [NfdSink(lambda: self.settings), *kube.pop("sinks", ())]
        pods = kube.pop("allocations", self._allocations)
        return agent_pipeline(
            self.store,
            lambda: self.settings,
            self._reset,
            self._lock_path,
            self.mps,
            self.stats,
            sinks,
            allocations=with_owners(pods, self.owners, inventory_reader(self.session)),
            clock=self.monotonic,
            owners=self.owners,
            **kube,
        )

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
        self.mps.probe(self.supervisor.check_once)
        self.exposition.changed()

    # -- Kubernetes (imported only when asked for) ---------------------------------------------

    def _setup_kube(self) -> None:
        from nodeagent.kube.api import KubeSettings, NodeApi, make_api_client
        from nodeagent.kube.clients import ClientSettings, GpuClients
        from nodeagent.kube.controller import (
            KubeReporter,
            NodeLabelDesire,
            NodeLabelSink,
            NodeView,
            NodeWatcher,
            ensure_node,
        )
        from nodeagent.kube.nodefeature import NodeFeatureSink, PodRef
        from nodeagent.kubelet.podresources import pod_devices

        k = self.settings.kube
        assert k.node_name is not None
        kube_settings = KubeSettings(
            node_name=k.node_name,
            host=k.host,
            kubeconfig=k.kubeconfig,
            watch_timeout_seconds=k.watch_timeout_seconds,
        )
        api_client = make_api_client(kube_settings, self.stop_event)
        api = NodeApi(api_client, kube_settings, self.stop_event)
        view = NodeView()
        view.update(ensure_node(api))
        desire = NodeLabelDesire(view, k.mig_config_label)

        def interruptible_sleep(seconds: float) -> None:
            if self.stop_event.wait(seconds):
                raise KubeError("the agent is stopping")

        def clients(s: Settings) -> GpuClients:
            cs = ClientSettings(
                pause={n: dict(sel) for n, sel in s.kube.pause_components.items()},
                restart=tuple(dict(sel) for sel in s.kube.restart_pods),
                wait_seconds=s.kube.clients_wait_seconds,
                poll_seconds=min(1.0, s.kube.clients_wait_seconds / 10),
            )
            return GpuClients(api, cs, sleep=interruptible_sleep)

        socket = k.pod_resources_socket
        sinks: list[Any] = [NodeLabelSink(api, view)]
        if k.node_feature_api:
            assert k.pod_namespace is not None  # the settings checked it
            pod = PodRef(k.pod_name, k.pod_uid) if k.pod_name else None
            sinks.append(NodeFeatureSink(api, k.pod_namespace, pod))
        # a test's own allocations win over the kubelet's socket
        socket_allocations = (lambda: pod_devices(socket)) if socket is not None else None
        allocations = self._allocations or socket_allocations
        # The pipeline with the Node's ports, built before its first run.
        self.pipeline = self._pipeline(
            desire=desire,
            reporter=KubeReporter(api, view, desire),
            sinks=sinks,
            clients=clients,
            allocations=allocations,
        )
        if self.settings.dra.enabled:  # an edge of the pipeline: its MIG changes go through it
            self._setup_dra(kube_settings)
        self.held_failure = desire.failure
        self.watcher = NodeWatcher(api, view, self._wake_reconcile, self.stop_event)

    def _setup_dra(self, kube_settings: Any) -> None:
        """The DRA kubelet plugin beside the device-plugin path, serving the kubelet from now;
        its MIG changes run through the agent's pipeline, its claims go into the ownership
        record that the pipeline reads (both count as busy)."""
        from nodeagent.dra.allocated import allocated_here
        from nodeagent.dra.plugin import DraPlugin

        self.dra = DraPlugin(
            self.session,
            self.settings,
            kube_settings,
            self.pipeline,
            self.owners,
            self.stop_event,
            self.dra_stats,
        )
        # A lost ownership record is rebuilt from the claims allocated here too.
        with_api(self.owners, allocated_here(self.dra.api, self.settings.dra.driver))
        self.dra.start()

    def publish_dra(self) -> None:
        """Every dra.health-interval: poll the devices' faults, then publish the ResourceSlices
        (written only when the devices or their taints changed) and the health board."""
        snap = self.store.snapshot
        if self.dra is None or snap is None:
            return
        d = self.settings.dra
        try:
            self.health.poll_faults()
        except AgentError as err:  # the faults known stay; the inventory is published anyway
            log.warning("dra.fault_poll_failed", error=str(err))
        policy = FaultPolicy(d.health_hold_seconds, frozenset(d.ignored_xids))
        self.dra.publish(snap.inventory, self.health.faults.active(policy), d.fatal_faults)

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
        dra = self.dra.node.problem() if self.dra is not None else None
        if dra is not None:
            return False, dra
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
            if self.settings.kube.enabled:
                self._setup_kube()
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
        workers = [
            # start() just refreshed and reconciled: those wait one period first.
            Worker("refresh", self.refresh, lambda: self.settings.metrics.refresh_interval_seconds,
                   self.stop_event, wait_first=True, clock=self.monotonic),
            Worker("gpm", self.sample_gpm, lambda: self.settings.metrics.gpm_interval_seconds,
                   self.stop_event, clock=self.monotonic),
            Worker("reconcile", self.reconcile, lambda: self.settings.reconcile.interval_seconds,
                   self.stop_event, wait_first=True,
                   busy_allowance_seconds=self._reconcile_allowance, clock=self.monotonic),
            Worker("mps-probe", self.probe_mps, lambda: self.settings.mps.probe_interval_seconds,
                   self.stop_event, wait_first=True, clock=self.monotonic),
        ]  # fmt: skip
        if self.dra is not None:
            workers.append(
                Worker("dra-publish", self.publish_dra,
                       lambda: self.settings.dra.health_interval_seconds, self.stop_event,
                       clock=self.monotonic)
            )  # fmt: skip
            from nodeagent.dra.binding import INTERVAL_SECONDS

            workers.append(
                Worker("dra-bind", self.dra.bind, lambda: INTERVAL_SECONDS, self.stop_event,
                       max_backoff_seconds=30, clock=self.monotonic)
            )  # fmt: skip
        if self.watcher is not None:
            workers.append(
                Worker(
                    "kube-watch",
                    self.watcher.cycle,
                    lambda: 0.0,
                    self.stop_event,
                    busy_allowance_seconds=kube.watch_timeout_seconds * 1.5 + 120,
                    max_backoff_seconds=30,
                    clock=self.monotonic,
                )
            )
        for worker in workers:
            self.workers[worker.name] = worker
            worker.start()

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
        if self.watcher is not None:
            self.watcher.api.interrupt()  # out of its blocking read
        if self.dra is not None:
            self.dra.api.interrupt()  # the binding watch too
        deadline = time.monotonic() + wait_seconds
        for worker in self.workers.values():
            if worker.is_alive():
                # A reconcile in the middle of a MIG change finishes it (it is short and safe
                # to interrupt only between NVML calls); idle workers are only waited briefly.
                busy_apply = worker.name == "reconcile" and self.pipeline.applying
                worker.join(20 if busy_apply else max(deadline - time.monotonic(), 0.05))
        if self.server is not None:
            self.server.stop()
        if self.dra is not None:
            self.dra.stop()
        self.mps.shutdown(stop_daemon=stop_mps)
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
