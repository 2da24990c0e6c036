"""Where the agent and the commands are put together, and nowhere else: the agent's whole graph
(`build_agent`: the snapshot store and its samplers, the MPS manager, the ownership record, the
one pipeline with its sinks and, with Kubernetes, its Node ports, the DRA plugin, the
collectors), and the pipelines of the commands that change the node (`mig apply|assert`,
`sharing apply|assert`) and of the DRA driver alone: the same steps, hooks, lock and checks."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.registry import CollectorRegistry

from nodeagent.agent.service import Agent, AgentParts, Current
from nodeagent.base.configfile import ConfigCache
from nodeagent.base.errors import KubeError, Stopping
from nodeagent.base.lock import mig_writer_lock
from nodeagent.base.logs import get_logger
from nodeagent.dra.node import NodeConfig, NodeDriver, Stats
from nodeagent.dra.traces import owner_store, with_api
from nodeagent.dra.users import PodUsers
from nodeagent.labels.nfd import write_features
from nodeagent.metrics.agent import AgentCollector, AgentStats
from nodeagent.metrics.collectorset import CollectorSet, NamedCollector
from nodeagent.metrics.dcgm import DcgmExposition
from nodeagent.metrics.dra import DraCollector, DraStats
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.fields import FieldCollector
from nodeagent.metrics.gpus import GpuCollector
from nodeagent.metrics.health import HealthCollector
from nodeagent.metrics.kube import KUBE_REQUESTS, KubeCollector
from nodeagent.metrics.mps import MpsCollector
from nodeagent.metrics.pods import PodCollector
from nodeagent.metrics.shares import ShareCollector
from nodeagent.metrics.sharing import SharingCollector
from nodeagent.metrics.slices import SliceCollector
from nodeagent.metrics.utilization import UtilizationCollector
from nodeagent.mig.apply import Done, Reset
from nodeagent.mig.config import MigConfigFile
from nodeagent.mps.intent import pipeline_pipe
from nodeagent.mps.manager import MpsManager
from nodeagent.mps.supervisor import MpsSupervisor
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.gpm import GpmReader
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.reconcile import (
    Clients,
    DesireSource,
    LabelSink,
    Pipeline,
    Report,
    Reporter,
    SettingsDesire,
    Stops,
    Wanted,
    mig_config_cache,
)
from nodeagent.settings import Settings
from nodeagent.sharing.deviceplugin import DevicePluginConfigSink
from nodeagent.sharing.offers import Offers
from nodeagent.state.faultlog import FaultLog, faultlog_path
from nodeagent.state.owners import OwnerStore, WithOwners, inventory_reader
from nodeagent.state.sampling import FieldSampler, GpmSampler, HealthSampler, UtilizationSampler
from nodeagent.state.snapshot import Allocations, Snapshot, Store

if TYPE_CHECKING:  # Kubernetes is imported only when asked for
    from nodeagent.dra.k8s.driver import DraDriver
    from nodeagent.kube.api import KubeSettings, NodeApi
    from nodeagent.kube.clients import GpuClients
    from nodeagent.kube.controller import KubeReporter, NodeLabelDesire, NodeView, NodeWatcher
    from nodeagent.kube.reconnect import Reconnect

log = get_logger("nodeagent.agent.factory")


class NfdSink:
    """Node Feature Discovery's local source: a features.d file, written when it changes."""

    name = "nfd"

    def __init__(self, settings: Callable[[], Settings]) -> None:
        self.settings = settings

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        path = self.settings().labels.nfd_features_file
        if path is not None and write_features(path, dict(labels)):
            log.info("labels.written", path=str(path))


def _fault_log(lock_path: Path | None) -> FaultLog | None:
    path = faultlog_path(lock_path)
    return None if path is None else FaultLog(path)


def build_agent(
    session: NvmlSession,
    settings: Settings,
    reset: Callable[[Settings], Reset],
    lock_path: Path | None = None,
    clock: Callable[[], float] = time.time,
    allocations: Allocations | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> Agent:
    """One node's agent, every part wired: `clock` (wall time) dates the snapshots, `monotonic`
    is the one clock the workers, the GPM sampler and the pipeline measure intervals with (a
    test may pass virtual ones); `allocations`: a test's own answer of which devices pods hold
    (else, with Kubernetes, the kubelet's pod-resources socket). Reads nothing from the API
    server: the Node's ports connect when the agent starts."""
    current = Current(settings)
    stop = threading.Event()
    store = Store(session, clock)
    # The share claims are measured against the utilization sampler's values.
    stats, dra_stats = AgentStats(), DraStats(lambda: store.utilization)
    mps = MpsManager(ComputeModeWriter(session), pipe=lambda: pipeline_pipe(current()))
    # Who owns each slice, read by every path that changes MIG (nodeagent.state.owners).
    owners = owner_store(session, settings.dra, lock_path)
    stops = AgentStops(stop)
    owners.default_wait = lambda: current().mig.lock_timeout_seconds  # a reload takes effect
    owners.stopped = stops.requested  # a wait for the record's lock gives way to SIGTERM
    node = NodeEdges(session, current, stop, owners, dra_stats) if settings.kube.enabled else None
    pods = node.allocations(allocations) if node is not None else allocations
    pipeline = agent_pipeline(
        store,
        current,
        reset,
        lock_path,
        mps,
        stats,
        [NfdSink(current), *(node.sinks if node is not None else ())],
        desire=node,
        allocations=WithOwners(pods, owners, inventory_reader(session)),
        clients=node.clients if node is not None else None,
        reporter=node,
        clock=monotonic,
        owners=owners,
        stops=stops,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorSet(collectors(store, stats, dra_stats, settings)))
    dcgm = DcgmExposition(
        store,
        settings.kube.node_name or socket.gethostname(),
        lambda: current().metrics.dcgm_compat,
    )
    parts = AgentParts(
        session=session,
        settings=current,
        clock=clock,
        monotonic=monotonic,
        stop_event=stop,
        store=store,
        stats=stats,
        dra_stats=dra_stats,
        gpm=GpmSampler(GpmReader(session), store, monotonic),
        # The faults that wait for a GPU reset or a node reboot are recorded beside the lock.
        health=HealthSampler(session, store, monotonic, clock, _fault_log(lock_path)),
        fields=FieldSampler(session, store, monotonic),
        # the MPS clients (an NVML read a device each refresh) only for the DRA share metrics
        utilization=UtilizationSampler(session, store, clock, mps_clients=settings.dra.enabled),
        mps=mps,
        supervisor=MpsSupervisor(),
        owners=owners,
        pipeline=pipeline,
        registry=registry,
        exposition=ExpositionCache(registry, dcgm.render),
        node=node,
        stop_nvml_errors=session.report_errors(store.publish_nvml_errors),
    )
    return Agent(parts)


class AgentStops:
    """The agent's stop (its stop event, set on SIGTERM or SIGINT) as a command's stop
    signals are to the pipeline (nodeagent.reconcile.ports.Stops): a MIG change ends between
    two NVML operations, as `mig apply`'s does, and a wait for the ownership record's lock
    ends at once. Nothing is held off: the agent's signals only set the event."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def deferred(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def requested(self) -> int:
        """SIGTERM while the agent stops (every change asked, not only the first: an undo
        after a stopped change stops too, leaving the record to say what is left)."""
        return signal.SIGTERM if self.stop.is_set() else 0


def collectors(
    store: Store, stats: AgentStats, dra_stats: DraStats, settings: Settings
) -> list[NamedCollector]:
    """The collectors, each reading the store (or the stats its owner writes) only."""
    return [
        GpuCollector(store),
        SliceCollector(store),
        PodCollector(store),
        HealthCollector(lambda: store.health),
        FieldCollector(store),
        UtilizationCollector(store),
        AgentCollector(stats, store),
        MpsCollector(store),
        SharingCollector(store),
        # with --kube / --dra only: the golden expositions of an agent without them stay
        *([KubeCollector(KUBE_REQUESTS)] if settings.kube.enabled else []),
        *([DraCollector(dra_stats)] if settings.dra.enabled else []),
        *([ShareCollector(dra_stats)] if settings.dra.enabled else []),
    ]


@dataclass(frozen=True)
class KubeParts:
    """The Node's ports once connected: the API, what the agent knows of its Node, the label
    desire and reporter, the label sinks by name, the Node's watcher, the DRA plugin (--dra)."""

    api: NodeApi
    view: NodeView
    desire: NodeLabelDesire
    reporter: KubeReporter
    sinks: Mapping[str, LabelSink]
    watcher: NodeWatcher
    dra: DraDriver | None


class NodeEdges:
    """The pipeline's Kubernetes ports, wired with the pipeline before it is built: its desire
    (the Node's labels), its reporter (the Node's state labels and Events), its label sinks
    (the Node, NodeFeature) and its GPU clients. `connect()`, at the agent's start, does what
    needs the API server (a kubeconfig's exec plugin, the Node's first read, the DRA plugin):
    after the metrics are served, and stopped by the agent's stop."""

    def __init__(
        self,
        session: NvmlSession,
        settings: Current,
        stop: threading.Event,
        owners: OwnerStore,
        dra_stats: DraStats,
    ) -> None:
        from nodeagent.kube.controller import NodeLabelSink
        from nodeagent.kube.nodefeature import NodeFeatureSink

        self.session, self.settings, self.stop = session, settings, stop
        self.owners, self.dra_stats = owners, dra_stats
        names = [NodeLabelSink.name]
        if settings().kube.node_feature_api:
            names.append(NodeFeatureSink.name)
        self.sinks: tuple[LabelSink, ...] = tuple(_NodeSink(self, n) for n in names)
        self.parts: KubeParts | None = None

    def allocations(self, given: Allocations | None) -> Allocations | None:
        """Which devices pods hold: a test's own answer wins over the kubelet's socket."""
        path = self.settings().kube.pod_resources_socket
        if given is not None or path is None:
            return given
        from nodeagent.kubelet.podresources import pod_devices

        return lambda: pod_devices(path)

    def kube_settings(self) -> KubeSettings:
        from nodeagent.kube.api import KubeSettings

        k = self.settings().kube
        assert k.node_name is not None  # the settings checked it
        return KubeSettings(
            node_name=k.node_name,
            host=k.host,
            kubeconfig=k.kubeconfig,
            watch_timeout_seconds=k.watch_timeout_seconds,
        )

    def connect(self, pipeline: Pipeline, wake: Callable[[], None]) -> KubeParts:
        """Reach the API server, read the Node (KubeError naming it when it cannot be read),
        and build the ports on it; with --dra the DRA plugin too, its MIG changes through
        `pipeline` (not yet serving: its `start()` is the agent's). `wake`: the reconcile
        worker's, for a change of the Node. Raises ConfigError, KubeError."""
        from nodeagent.kube.api import NodeApi, make_api_client
        from nodeagent.kube.controller import (
            KubeReporter,
            NodeLabelDesire,
            NodeLabelSink,
            NodeView,
            NodeWatcher,
            ensure_node,
        )
        from nodeagent.kube.nodefeature import NodeFeatureSink, PodRef
        from nodeagent.kube.reconnect import Reconnect

        s = self.settings()
        k = s.kube
        kube_settings = self.kube_settings()
        # One way back after an outage for all the agent's watches (nodeagent.kube.reconnect).
        reconnect = Reconnect()
        api = NodeApi(
            make_api_client(kube_settings, self.stop), kube_settings, self.stop, reconnect
        )
        view = NodeView()
        view.update(ensure_node(api))
        desire = NodeLabelDesire(view, k.mig_config_label)
        sinks: dict[str, LabelSink] = {NodeLabelSink.name: NodeLabelSink(api, view)}
        if k.node_feature_api:
            assert k.pod_namespace is not None  # the settings checked it
            pod = PodRef(k.pod_name, k.pod_uid) if k.pod_name else None
            sinks[NodeFeatureSink.name] = NodeFeatureSink(api, k.pod_namespace, pod)
        self.parts = KubeParts(
            api,
            view,
            desire,
            KubeReporter(api, view, desire),
            sinks,
            NodeWatcher(api, view, wake, self.stop),
            self._dra(s, kube_settings, pipeline, reconnect) if s.dra.enabled else None,
        )
        return self.parts

    def _dra(
        self, s: Settings, kube_settings: KubeSettings, pipeline: Pipeline, reconnect: Reconnect
    ) -> DraDriver:
        """The DRA kubelet plugin beside the device-plugin path: its MIG changes run through
        the agent's pipeline, its claims go into the ownership record that the pipeline reads
        (both count as busy)."""
        from nodeagent.dra.k8s.allocated import allocated_here
        from nodeagent.dra.k8s.driver import DraDriver

        dra = DraDriver(
            self.session, s, kube_settings, pipeline, self.owners, self.stop, self.dra_stats,
            reconnect, pipeline.mps.regimes,
        )  # fmt: skip
        # A lost ownership record is rebuilt from the claims allocated here too.
        with_api(self.owners, allocated_here(dra.api, s.dra.driver))
        return dra

    def connected(self) -> KubeParts:
        if self.parts is None:
            raise KubeError("the agent has not connected to the API server yet")
        return self.parts

    # -- the pipeline's ports -------------------------------------------------------------------

    def wanted(self, settings: Settings) -> Wanted:
        return self.connected().desire.wanted(settings)

    def changing(self, wanted: Wanted, operations: int) -> None:
        self.connected().reporter.changing(wanted, operations)

    def finished(self, report: Report) -> None:
        self.connected().reporter.finished(report)

    def clients(self, s: Settings) -> GpuClients:
        """The GPU clients to pause and restart around a MIG change, as `s` names them."""
        from nodeagent.kube.clients import ClientSettings, GpuClients

        cs = ClientSettings(
            pause={n: dict(sel) for n, sel in s.kube.pause_components.items()},
            restart=tuple(dict(sel) for sel in s.kube.restart_pods),
            wait_seconds=s.kube.clients_wait_seconds,
            poll_seconds=min(1.0, s.kube.clients_wait_seconds / 10),
        )
        return GpuClients(self.connected().api, cs, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise Stopping("the agent is stopping")

    def failure(self) -> str | None:
        """Why a node-label config is not applied while it stays failed (for /readyz)."""
        return self.parts.desire.failure() if self.parts is not None else None


class _NodeSink:
    """One of the Node's label sinks, as the pipeline is built with it (connected at start)."""

    def __init__(self, edges: NodeEdges, name: str) -> None:
        self.edges, self.name = edges, name

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        self.edges.connected().sinks[self.name].publish(labels, snapshot)


def agent_pipeline(
    store: Store,
    settings: Callable[[], Settings],
    reset: Callable[[Settings], Reset],
    lock_path: Path | None,
    mps: MpsManager,
    stats: AgentStats,
    sinks: Sequence[LabelSink] = (),
    desire: DesireSource | None = None,
    allocations: Allocations | None = None,
    clients: Callable[[Settings], Clients | None] | None = None,
    reporter: Reporter | None = None,
    on_published: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    owners: OwnerStore | None = None,
    stops: Stops | None = None,
) -> Pipeline:
    """The agent's pipeline: its sinks, then the device plugin's config (when
    sharing.plugin-config-out is set), under the MIG writer lock at `lock_path`; step
    durations measured with `clock` (the agent's one monotonic clock); `stops`: the agent's
    stop, which ends a MIG change between two NVML operations."""
    offers = Offers(store.publish_offers)  # the metrics read what each GPU offers there
    plugin = DevicePluginConfigSink(
        lambda: settings().sharing.plugin_config_out,
        lambda: offers.per_gpu,
        lambda: settings().labels.mig_strategy,
    )
    return Pipeline(
        store=store,
        settings=settings,
        desire=desire or SettingsDesire(),
        reset=reset,
        mps=mps,
        stats=stats,
        writer_lock=lambda s: mig_writer_lock(lock_path, s.mig.lock_timeout_seconds),
        sinks=(*sinks, plugin),
        allocations=allocations,
        clients=clients or (lambda _s: None),
        reporter=reporter,
        on_published=on_published,
        offers=offers,
        clock=clock,
        owners=owners,
        stops=stops,
    )


def command_pipeline(
    session: NvmlSession,
    settings: Settings,
    reset: Reset,
    lock_path: Path | None,
    on_operation: Callable[[Done], None] | None = None,
    configs: ConfigCache[MigConfigFile] | None = None,
    allocations: Allocations | None = None,
    owners: OwnerStore | None = None,
    stops: Stops | None = None,
) -> Pipeline:
    """One command's run: no sinks (a command publishes nothing), failures said once by the
    command, hooks around every run as mig-parted's apply, each NVML operation reported to
    `on_operation` as it completes. `configs`: the MIG config file as the command read it;
    `allocations`: which devices pods hold; the claims of the node's ownership record
    (nodeagent.state.owners, beside the MIG writer lock) count as held too. `stops`: the
    command's stop signals (held off while it changes the node)."""
    owners = owners or owner_store(session, settings.dra, lock_path)
    owners.default_wait = lambda: settings.mig.lock_timeout_seconds
    if stops is not None:  # a wait for the record's lock gives way to the command's stop
        owners.stopped = stops.requested
    return Pipeline(
        store=Store(session, time.time),
        settings=lambda: settings,
        desire=SettingsDesire(),
        reset=lambda _s: reset,
        mps=MpsManager(ComputeModeWriter(session), pipe=lambda: pipeline_pipe(settings)),
        stats=AgentStats(),
        writer_lock=lambda s: mig_writer_lock(lock_path, s.mig.lock_timeout_seconds),
        log_failures=False,
        one_shot=True,
        on_operation=on_operation,
        configs=configs or mig_config_cache(),
        allocations=WithOwners(allocations, owners, inventory_reader(session)),
        owners=owners,
        stops=stops,
    )


def dra_driver(
    session: NvmlSession,
    settings: Settings,
    config: NodeConfig,
    reset: Reset,
    lock_path: Path | None,
    pods: Allocations | None = None,
    owners: OwnerStore | None = None,
    stats: Stats | None = None,
    users: PodUsers | None = None,
) -> NodeDriver:
    """The DRA driver's node side on a pipeline of its own (a test, a benchmark; the agent
    gives it the agent's pipeline): its MIG changes go through the pipeline's steps, under
    the MIG writer lock at `lock_path`, around the pods' devices and the claims of the
    ownership record (`owners`; default: the one beside the lock). `users`: a share claim's
    user read from its pods (the agent's does; None: from its MpsShare config alone)."""
    dra = dataclasses.replace(settings.dra, plugin_dir=config.plugin_dir, cdi_dir=config.cdi_dir)
    settings = dataclasses.replace(settings, dra=dra)
    owners = owners or owner_store(session, dra, lock_path)
    pipeline = command_pipeline(
        session, settings, reset, lock_path, allocations=pods, owners=owners
    )
    config = dataclasses.replace(config, share_sm_limit=settings.dra.mps_share_sm_limit)
    node = NodeDriver(
        session, config, pipeline, owners, stats, users=users, regimes=pipeline.mps.regimes
    )
    node.start()
    return node
