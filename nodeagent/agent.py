"""The reconcile loop: wires NVML, MIG geometry and metrics. Steps have names that appear in
logs and in failure reasons."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client.registry import CollectorRegistry

from nodeagent.errors import AgentError, ConfigError
from nodeagent.kube.api import KubeSettings, NodeApi, make_core_api
from nodeagent.kube.clients import ClientSettings, GpuClients
from nodeagent.kube.controller import NodeController, ensure_node
from nodeagent.kube.nodelabels import ANNOTATION_PREFIX
from nodeagent.kube.podresources import DEFAULT_SOCKET, allocated_devices
from nodeagent.labels.nfd import write_features
from nodeagent.labels.render import DEFAULT_PREFIX, SharingState, render_labels, slice_usage
from nodeagent.metrics.agent import AgentCollector, AgentStats
from nodeagent.metrics.collectorset import CollectorSet
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.gpus import GpuCollector
from nodeagent.metrics.mps import MpsCollector
from nodeagent.metrics.sampling import GpmSampler, Periodic, refresh_inventory
from nodeagent.metrics.server import DEFAULT_METRICS_ADDRESS, MetricsServer
from nodeagent.metrics.slices import SliceCollector
from nodeagent.metrics.store import Store
from nodeagent.mig.apply import Reset, assert_config, load_config, reconfigure
from nodeagent.mig.config import MigConfigFile
from nodeagent.mps.daemon import MpsDaemon, MpsStatus
from nodeagent.mps.settings import MpsSettings, validate
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.gpm import GpmReader
from nodeagent.nvml.write import ComputeModeWriter

log = structlog.get_logger("nodeagent.agent")
SLICES_ANNOTATION = ANNOTATION_PREFIX + "mig.slices"


@dataclass(frozen=True)
class KubeConfig:
    settings: KubeSettings
    clients: ClientSettings = field(default_factory=ClientSettings)
    pod_resources_socket: Path | None = DEFAULT_SOCKET


@dataclass(frozen=True)
class AgentConfig:
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    refresh_interval_seconds: float = 5.0
    gpm_interval_seconds: float = 1.0
    reconcile_interval_seconds: float = 30.0
    mig_config_file: str | None = None
    mig_config: str | None = None
    mps: MpsSettings | None = None
    label_prefix: str = DEFAULT_PREFIX
    nfd_features_file: Path | None = None
    kube: KubeConfig | None = None

    def validate(self) -> None:
        for name in (
            "refresh_interval_seconds",
            "gpm_interval_seconds",
            "reconcile_interval_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be > 0")
        if self.gpm_interval_seconds < 0.1:
            raise ConfigError("gpm interval must be at least 0.1 s (two GPM samples need 100 ms)")
        if self.kube is not None:
            if self.mig_config:
                raise ConfigError(
                    "with Kubernetes the MIG config name comes from the node label"
                    " nvidia.com/mig.config; drop -c (keep -f, the file of configs)"
                )
        elif bool(self.mig_config_file) != bool(self.mig_config):
            raise ConfigError("a MIG config needs both the file and the name (-f and -c)")


class Agent:
    """One node's agent. Build it, then `start()` (threads + HTTP) or drive it step by step."""

    def __init__(
        self,
        session: NvmlSession,
        config: AgentConfig,
        reset: Reset,
        clock: Callable[[], float] = time.time,
    ) -> None:
        config.validate()
        self.session = session
        self.config = config
        self.reset = reset
        self.clock = clock
        self.store = Store()
        self.stats = AgentStats()
        self.gpm = GpmSampler(GpmReader(session), self.store, time.monotonic)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            CollectorSet(
                [
                    GpuCollector(self.store),
                    SliceCollector(self.store),
                    AgentCollector(self.stats, self.store, lambda: session.errors_by_function),
                    MpsCollector(lambda: self.mps_status),
                ]
            )
        )
        self.exposition = ExpositionCache(self.registry)
        self.stop_event = threading.Event()
        self.last_error: str | None = None
        self.reconciled = False
        self._threads: list[threading.Thread] = []
        self.server: MetricsServer | None = None
        self.mps_daemon: MpsDaemon | None = None
        self.mps_status: MpsStatus | None = None
        self.controller: NodeController | None = None

    # -- steps ----------------------------------------------------------------------------

    def refresh(self) -> None:
        refresh_inventory(self.session, self.store, self.clock)
        if self.config.kube is not None and self.config.kube.pod_resources_socket is not None:
            try:
                self.store.allocated = self.in_use()
            except AgentError as err:  # metrics keep the last answer; changes still fail safe
                log.warning("podresources.failed", error=str(err))
        self.exposition.render()

    def sample_gpm(self) -> None:
        self.gpm.tick()
        self.exposition.render()

    def reconcile(self) -> str:
        """Observe, then bring MIG to the configured config if there is one. Returns
        'success' or 'failure'; the reason of a failure is in `last_error`."""
        start = time.monotonic()
        step = "observe"
        try:
            self.refresh()
            if self.config.mig_config_file and self.config.mig_config:
                step = "read-config"
                cfg = self._mig_file()
                step = "apply-mig"
                outcome = reconfigure(self.session, cfg, self.config.mig_config, self.reset)
                if outcome.done:
                    log.info(
                        "mig.changed", config=self.config.mig_config, operations=len(outcome.done)
                    )
                self.refresh()
            step = "publish"
            self.publish_labels()
            result, self.last_error = "success", None
        except AgentError as err:
            result, self.last_error = "failure", f"{step}: {err}"
            log.error("reconcile.failed", step=step, error=str(err))
        self.stats.record(result, time.monotonic() - start, self.clock())
        self.reconciled = True
        self.exposition.render()
        return result

    # -- MIG through the node label (the controller's host interface) ----------------------

    def in_use(self) -> dict[str, str]:
        """MIG/GPU UUIDs pods hold, from the kubelet (none without Kubernetes)."""
        kube = self.config.kube
        if kube is None or kube.pod_resources_socket is None:
            return {}
        return allocated_devices(kube.pod_resources_socket)

    def _mig_file(self) -> MigConfigFile:
        return load_config(self.config.mig_config_file)

    def mig_matches(self, name: str) -> bool:
        problems, _ = assert_config(self.session, self._mig_file(), name)
        return not problems

    def plan_mig(self, name: str) -> int:
        outcome = reconfigure(
            self.session, self._mig_file(), name, self.reset, in_use=self.in_use(), dry_run=True
        )
        return len(outcome.plan.operations)

    def apply_mig(self, name: str) -> int:
        outcome = reconfigure(
            self.session, self._mig_file(), name, self.reset, in_use=self.in_use()
        )
        return len(outcome.done)

    def node_labels(self) -> dict[str, str]:
        return self.labels()

    def node_annotations(self) -> dict[str, str | None]:
        inventory = self.store.inventory
        if inventory is None:
            return {}
        # The kubelet's answer from the last refresh: one gRPC call per refresh, not per event.
        return {SLICES_ANNOTATION: slice_usage(inventory, self.store.allocated)}

    def start_kube(self) -> None:
        assert self.config.kube is not None
        settings = self.config.kube.settings
        api = NodeApi(make_core_api(settings), settings)
        ensure_node(api)
        self.controller = NodeController(
            api, self, GpuClients(api, self.config.kube.clients), self.stop_event
        )
        self._threads.append(
            threading.Thread(target=self.controller.run, name="kube-watch", daemon=True)
        )

    def sharing(self) -> SharingState:
        if self.config.mps is not None and self.mps_daemon is not None:
            return SharingState("mps", self.config.mps.replicas)
        return SharingState()

    def labels(self) -> dict[str, str]:
        inventory = self.store.inventory
        return (
            {}
            if inventory is None
            else render_labels(inventory, self.sharing(), self.config.label_prefix)
        )

    def publish_labels(self) -> None:
        path = self.config.nfd_features_file
        if path is None or self.store.inventory is None:
            return
        if write_features(path, self.labels()):
            log.info("labels.written", path=str(path))

    def start_mps(self) -> None:
        """Validate the MPS settings against the GPUs, start the daemon, supervise it."""
        assert self.config.mps is not None
        if self.store.inventory is None:
            self.refresh()
        assert self.store.inventory is not None
        limits = validate(self.config.mps, self.store.inventory)
        self.mps_daemon = MpsDaemon(self.config.mps, limits, ComputeModeWriter(self.session))
        self.mps_status = self.mps_daemon.start()

        def checked() -> None:
            assert self.mps_daemon is not None
            self.mps_status = self.mps_daemon.status()

        self._threads.append(MpsSupervisor(self.mps_daemon, self.stop_event, on_checked=checked))

    # -- health ---------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        age = self.clock() - self.store.inventory_time
        limit = 3 * self.config.refresh_interval_seconds + 5
        if self.store.inventory is None:
            return False, "no GPU inventory read yet"
        if age > limit:
            return False, f"GPU inventory is {age:.0f} s old (limit {limit:.0f} s)"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.reconciled or self.store.inventory is None:
            return False, "first reconcile not done"
        if self.last_error:
            return False, self.last_error
        return True, "ok"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.server = MetricsServer(
            self.config.metrics_address, self.exposition.latest, self.healthy, self.ready
        )
        if self.config.mps is not None:
            self.start_mps()
        if self.config.kube is not None:
            self.start_kube()
        self.reconcile()
        self.server.start()
        self._threads += [
            # start() just refreshed and reconciled: the periodic ones wait a period first.
            Periodic(
                "refresh",
                self.refresh,
                self.config.refresh_interval_seconds,
                self.stop_event,
                wait_first=True,
            ),
            Periodic("gpm", self.sample_gpm, self.config.gpm_interval_seconds, self.stop_event),
            Periodic(
                "reconcile",
                self.reconcile_quiet,
                self.config.reconcile_interval_seconds,
                self.stop_event,
                wait_first=True,
            ),
        ]
        for t in self._threads:
            t.start()

    def reconcile_quiet(self) -> None:
        self.reconcile()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=10)
        if self.server:
            self.server.stop()
        if self.mps_daemon is not None:
            self.mps_daemon.stop()
        self.gpm.close()
