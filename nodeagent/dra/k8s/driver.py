"""The DRA driver as the agent runs it (`nodeagent run --kube --dra`): the kubelet plugin's
gRPC services, the node's ResourceSlices kept up to date (faulty devices tainted), the devices'
health streamed to the kubelet, and the claims' devices counted as busy by the rest of the
agent."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.logs import get_logger
from nodeagent.dra.devices import SliceSpec, resource_slices
from nodeagent.dra.health import HealthBoard
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.binding import Binder
from nodeagent.dra.k8s.server import KubeletPluginServer, Sockets
from nodeagent.dra.k8s.slices import GateWatch, SlicePublisher
from nodeagent.dra.nocounters import safe_slices
from nodeagent.dra.node import NodeConfig, NodeDriver, Stats
from nodeagent.dra.sharewatch import ShareWatch
from nodeagent.dra.taints import DeviceFault, device_faults, device_names, with_taints
from nodeagent.dra.users import PodUsers
from nodeagent.kube.api import KubeSettings, make_api_client
from nodeagent.kube.reconnect import Reconnect
from nodeagent.mps.regimes import MpsRegimes
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.reconcile.claims import ClaimEngine
from nodeagent.settings import Settings
from nodeagent.state.faults import Fault, FaultKey
from nodeagent.state.owners import OwnerStore

log = get_logger("nodeagent.dra")
PLUGIN_SOCKET = "dra.sock"


def sockets(settings: Settings) -> Sockets:
    d = settings.dra
    return Sockets(d.plugin_path / PLUGIN_SOCKET, d.registry_dir / f"{d.driver}-reg.sock")


class DraDriver:
    """Built from the settings; `start()` serves the kubelet, `publish()` the slices."""

    def __init__(
        self,
        session: NvmlSession,
        settings: Settings,
        kube: KubeSettings,
        engine: ClaimEngine,
        owners: OwnerStore,
        stop: threading.Event | None = None,
        stats: Stats | None = None,
        reconnect: Reconnect | None = None,
        regimes: MpsRegimes | None = None,
    ) -> None:
        """`reconnect`: the agent's, shared with its Node watch (nodeagent.kube.reconnect);
        `regimes`: its MPS manager's (a share server and its daemon exclude each other)."""
        d = settings.dra
        self.driver = d.driver
        self.devices = d.devices
        self.mps_shares = d.mps_shares
        if d.devices is not None:  # a GPU the node lacks is a mistake, not a GPU to skip
            with session.lock:
                have = sorted(g.index for g in read_inventory(session).gpus)
            missing = sorted(set(d.devices) - set(have))
            if missing:
                raise ConfigError(
                    f"dra.devices (--dra-devices, NODEAGENT_DRA_DEVICES) names GPU"
                    f" {', '.join(map(str, missing))}; this node has GPUs {have}"
                )
        self.api = DraApi(make_api_client(kube), kube, stop, reconnect)
        config = NodeConfig(
            driver=d.driver,
            pool=kube.node_name,
            plugin_dir=d.plugin_path,
            cdi_dir=d.cdi_dir,
            gpus=d.devices,
            mps_control=settings.mps.control,
            share_sm_limit=d.mps_share_sm_limit,
        )
        self.node = NodeDriver(
            session, config, engine, owners, stats, users=PodUsers(self.api), regimes=regimes
        )
        self.board = HealthBoard()
        where = sockets(settings)
        self.server = KubeletPluginServer(self.node, self.api, d.driver, where, self.board)
        self.binder = Binder(self.api, self.node, self.server.v1.reports)
        enforce = d.mps_share_enforce
        self.shares = ShareWatch(
            self.node, self.server.v1.reports, self.api, stats, enforce=lambda: enforce
        )
        self.publisher = SlicePublisher(self.api, d.driver)
        self.gate = GateWatch(self.api, d.driver, self.publisher)
        self.binding = d.binding_conditions
        self.faulty: dict[str, DeviceFault] = {}  # the devices tainted now
        self._built: tuple[Any, ...] = ()  # (inventory, counters dropped, binding, slices)

    @property
    def checkpoint(self) -> Path:
        return self.node.config.checkpoint

    def start(self) -> None:
        """Take the plugin directory, write the ownership record if there is none, then serve
        the kubelet. Raises LockHeld (another agent serves the directory), KubeError when a
        socket cannot be made."""
        self.server.start()  # the plugin directory's lock first: one agent does what follows
        try:
            self.node.start()
        except Exception:
            self.server.stop()
            raise

    def publish(
        self,
        inventory: Inventory,
        faults: Mapping[FaultKey, Fault] | None = None,
        fatal_kinds: Collection[str] = (),
    ) -> bool:
        """Bring the node's ResourceSlices to `inventory`, each device with a fault in `faults`
        tainted (NoExecute where its fault is in `fatal_kinds`), and the health board to the
        same; True when something was written. Where the API server drops the counters
        (nodeagent.dra.k8s.slices.GateWatch), only devices that cannot overlap
        (nodeagent.dra.nocounters). Raises KubeError."""
        slices = self._slices(inventory, self.gate.counters_dropped())
        faulty = device_faults(slices, faults or {}, fatal_kinds)
        self._say(faulty)
        self.board.update(device_names(slices), {n: f.reason for n, f in faulty.items()})
        if self.publisher.taints_dropped:  # the API server drops them: said once, left out
            return self.publisher.publish(slices)
        return self.publisher.publish(with_taints(slices, faulty, self.driver))

    def watch_shares(self) -> None:
        """One look of the share watch (nodeagent.dra.sharewatch), on a worker of its own:
        the share servers kept up, their clients watched. Never raises."""
        self.shares.tick()

    def bind(self) -> None:
        """One pass of the binding watcher (nodeagent.dra.k8s.binding): the claims listed if need
        be, then watched until the API server ends the watch; the slices of those the
        scheduler waits on made, their binding conditions written. Raises KubeError."""
        self.binder.run()

    def _slices(self, inventory: Inventory, dropped: bool) -> list[SliceSpec]:
        """The untainted slices, built again only when the inventory or the gate changed (the
        fault poll asks every dra.health-interval)."""
        binding = self.binding and not self.publisher.binding_dropped
        if self._built and self._built[0] is inventory and self._built[1:3] == (dropped, binding):
            slices: list[SliceSpec] = self._built[3]
            return slices
        if dropped:
            slices = safe_slices(inventory, self.api.name, self.driver, self.devices)
        else:
            slices = resource_slices(
                inventory, self.api.name, self.driver, self.devices, self.mps_shares, binding
            )
        self._built = (inventory, dropped, binding, slices)
        return slices

    def _say(self, faulty: dict[str, DeviceFault]) -> None:
        """One log line per new (reason, effect) and one for the devices healthy again."""
        new: dict[tuple[str, str], list[str]] = {}
        for name, f in faulty.items():
            if self.faulty.get(name) != f:
                new.setdefault((f.reason, f.effect), []).append(name)
        for (reason, effect), names in sorted(new.items()):
            log.warning("dra.devices_tainted", devices=names, reason=reason, effect=effect)
        healthy = [name for name in self.faulty if name not in faulty]
        if healthy:
            log.info("dra.devices_healthy", devices=healthy)
        self.faulty = faulty

    def stop(self) -> None:
        self.api.interrupt()  # the binding watch ends at once, not at its timeout
        self.server.stop()
