"""The DRA kubelet plugin's gRPC services, over unix sockets.

The kubelet's plugin watcher finds `<registry dir>/<driver>-reg.sock`, calls
`Registration.GetInfo` (type DRAPlugin, the driver's name, the endpoint of its DRA service and
the service versions it serves) and tells the plugin the outcome with
`NotifyRegistrationStatus`. It then calls `NodePrepareResources` before a pod's containers start
and `NodeUnprepareResources` once they are gone, on `<plugin dir>/dra.sock`, as service
`v1.DRAPlugin` (Kubernetes >= 1.34) or `v1beta1.DRAPlugin` (older); both are served, from
kubernetes/kubelet@63b3249724f7:pkg/apis/dra/{v1,v1beta1}/api.proto and
pkg/apis/pluginregistration/v1/api.proto. Every claim gets its own answer: one claim's error
never fails the others.

The same socket serves the kubelet's resource-health stream (KEP-4680, the kubelet's
ResourceHealthStatus gate): `DRAResourceHealth.NodeWatchResources` in its three versions, all
advertised at registration. Kubelets 1.34 and 1.35 call `v1alpha1.DRAResourceHealth`
unconditionally (kubernetes/kubernetes pkg/kubelet/cm/dra/plugin/dra_plugin.go); newer ones
pick the newest of `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth` the registration lists
(pickHealthService), and a kubelet ignores versions it does not know. The messages are the
same in each (v1alpha1 lacks `message` and `health_check_timeout_seconds`), from
staging/src/k8s.io/kubelet/pkg/apis/dra-health/{v1alpha1,v1beta1,v1}/api.proto.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from nodeagent.base.errors import AgentError, KubeError, LockError, LockHeld, SocketError
from nodeagent.base.files import open_lock_file
from nodeagent.base.logs import get_logger
from nodeagent.dra.claims import ClaimRef, checked_claim, checked_ref, quoted
from nodeagent.dra.health import RESEND_SECONDS, HealthBoard, Reading
from nodeagent.dra.inflight import Superseded
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.reports import StatusReports
from nodeagent.dra.node import NodeDriver
from nodeagent.kubelet.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = get_logger("nodeagent.dra")
PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1beta1.DRAResourceHealth": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}


@dataclass(frozen=True)
class Sockets:
    plugin: Path  # <plugin dir>/dra.sock: the DRA service
    registration: Path  # <registry dir>/<driver>-reg.sock: the kubelet's plugin watcher


class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(  # type: ignore[attr-defined]
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=[*SERVICES, *HEALTH],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
            log.info("dra.registered", driver=self.driver)
        else:
            log.error("dra.registration_failed", driver=self.driver, error=request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()  # type: ignore[attr-defined]


# The kubelet gives every call 45 s (kubernetes v1.36 pkg/kubelet/cm/dra/plugin/
# registration.go: defaultClientCallTimeout, "half of the kubelet retry period"); its context
# deadline says so when the call carries one. A prepare answers this much before it, so its
# error (not the kubelet's timeout) is what the pod's event shows.
KUBELET_CALL_SECONDS = 45.0
ANSWER_MARGIN_SECONDS = 3.0
# The API read's share: its own retries stop here, leaving time for the MIG change.
API_SHARE = 0.5
# Threads for the kubelet's calls; prepares may take at most PREPARE_SLOTS of them, so an
# unprepare (and a registration call) always finds one free.
# Health streams (the kubelet holds one open for as long as it runs) take at most
# HEALTH_STREAMS threads more.
PREPARE_SLOTS = 12
HEALTH_STREAMS = 2
WORKERS = 16 + HEALTH_STREAMS


def _deadline(context: Any) -> float:
    """The monotonic time by which a call must answer: the gRPC deadline (if the caller set
    one) or the kubelet's 45 s, less a margin."""
    remaining = None
    with contextlib.suppress(Exception):
        remaining = context.time_remaining()
    if remaining is None or remaining <= 0 or remaining > KUBELET_CALL_SECONDS:
        remaining = KUBELET_CALL_SECONDS
    return time.monotonic() + max(0.5, remaining - ANSWER_MARGIN_SECONDS)


def _internal(err: BaseException) -> str:
    """One sentence for an error that is not the driver's own (a bug): its type and the start
    of its text; the traceback goes to the debug log."""
    return f"internal error ({type(err).__name__}: {quoted(str(err))}); see the agent's log"


def _about(where: str, error: str) -> str:
    """`error` as the answer about the claim `where`: named once, first."""
    return (
        error
        if error.startswith(f"{where} ") or error.startswith(f"{where}:")
        else (f"{where}: {error}")
    )


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one version of the API (`pb`). Every
    claim of a call gets its own answer: a claim that is malformed, refused or breaks never
    fails the others."""

    def __init__(
        self,
        node: NodeDriver,
        api: DraApi,
        pb: ModuleType,
        slots: threading.Semaphore,
        reports: StatusReports,
    ) -> None:
        self.node = node
        self.api = api
        self.pb = pb
        self.slots = slots
        self.reports = reports

    def _prepare_one(self, claim: Any, deadline: float) -> Any:
        where = f"claim {quoted(claim.namespace)}/{quoted(claim.name)}"
        read: tuple[ClaimRef, dict[str, Any]] | None = None  # the claim, once it is this one
        try:
            ref = checked_ref(claim.namespace, claim.name, claim.uid)
            where = str(ref)
            # The ticket before the read: an unprepare from now on supersedes this prepare.
            with self.node.inflight.prepare(ref.uid) as ticket:
                budget = (deadline - time.monotonic()) * API_SHARE
                obj = self.api.read_claim(ref.namespace, ref.name, budget_seconds=max(0.1, budget))
                if obj is None:
                    raise KubeError(f"{ref} does not exist")
                obj = checked_claim(obj, str(ref))  # one that cannot be read: its own answer
                uid = (obj.get("metadata") or {}).get("uid")
                if uid != ref.uid:
                    raise KubeError(f"{ref} has UID {quoted(uid)}, not {ref.uid}: it was replaced")
                read = ref, obj
                prepared = self.node.prepare(ref, obj, deadline, ticket)
        except AgentError as err:
            log.warning("dra.prepare_failed", claim=where, error=str(err))
            if read is not None and not isinstance(err, Superseded):  # unprepared: cleared
                self.reports.failed(*read, str(err), deadline)
            return self.pb.NodePrepareResourceResponse(error=_about(where, str(err)))
        except Exception as err:  # a bug: this claim's answer, not the whole call's
            log.debug("dra.prepare_crashed", claim=where, exc_info=True)
            log.error("dra.prepare_failed", claim=where, error=_internal(err))
            if read is not None:
                self.reports.failed(*read, _internal(err), deadline)
            return self.pb.NodePrepareResourceResponse(error=f"{where}: {_internal(err)}")
        self.reports.prepared(ref, obj, prepared, deadline)
        devices = [
            self.pb.Device(
                request_names=[p.request],
                pool_name=p.pool,
                device_name=p.device,
                cdi_device_ids=list(p.cdi_ids),
            )
            for p in prepared
        ]
        return self.pb.NodePrepareResourceResponse(devices=devices)

    def _unprepare_one(self, claim: Any, deadline: float) -> Any:
        where = f"claim {quoted(claim.namespace)}/{quoted(claim.name)}"
        try:
            ref = checked_ref(claim.namespace, claim.name, claim.uid)
            where = str(ref)
            self.node.unprepare(ref.uid, deadline)
            self.reports.cleared(ref, deadline)
        except AgentError as err:
            log.warning("dra.unprepare_failed", claim=where, error=str(err))
            return self.pb.NodeUnprepareResourceResponse(error=_about(where, str(err)))
        except Exception as err:
            log.debug("dra.unprepare_crashed", claim=where, exc_info=True)
            log.error("dra.unprepare_failed", claim=where, error=_internal(err))
            return self.pb.NodeUnprepareResourceResponse(error=f"{where}: {_internal(err)}")
        return self.pb.NodeUnprepareResourceResponse()

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        deadline = _deadline(context)
        if not self.slots.acquire(blocking=False):
            busy = self.pb.NodePrepareResourceResponse(
                error=f"the driver is preparing {PREPARE_SLOTS} calls already; the kubelet"
                " retries this one"
            )
            return self.pb.NodePrepareResourcesResponse(
                claims={c.uid: busy for c in request.claims}
            )
        try:
            answers: dict[str, Any] = {}
            for c in request.claims:  # a uid listed twice is prepared once
                if c.uid not in answers:
                    answers[c.uid] = self._prepare_one(c, deadline)
        finally:
            self.slots.release()
        return self.pb.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        deadline = _deadline(context)
        answers: dict[str, Any] = {}
        for c in request.claims:
            if c.uid not in answers:
                answers[c.uid] = self._unprepare_one(c, deadline)
        return self.pb.NodeUnprepareResourcesResponse(claims=answers)


class HealthService:
    """NodeWatchResources for one version of the health API (`pb`): the board at once, then at
    every change and at least every RESEND_SECONDS, until the kubelet hangs up or the server
    stops. At most HEALTH_STREAMS at a time (over all versions): another is refused with
    RESOURCE_EXHAUSTED, never left to hold a thread a prepare needs."""

    def __init__(
        self, board: HealthBoard, pool: str, pb: ModuleType, streams: threading.Semaphore
    ) -> None:
        self.board = board
        self.pool = pool
        self.pb = pb
        self.streams = streams
        self._has_message = "message" in pb.DeviceHealth.DESCRIPTOR.fields_by_name

    def _response(self, reading: Reading) -> Any:
        pb = self.pb
        devices = []
        for d in reading.devices:
            extra = {"message": d.message} if self._has_message and d.message else {}
            devices.append(
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name=self.pool, device_name=d.device),
                    health=pb.HEALTHY if d.healthy else pb.UNHEALTHY,
                    last_updated_time=int(reading.determined_at),
                    **extra,
                )
            )
        return pb.NodeWatchResourcesResponse(devices=devices)

    def NodeWatchResources(self, request: Any, context: Any) -> Any:
        if not self.streams.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the driver serves {HEALTH_STREAMS} health streams already",
            )
        try:
            context.add_callback(self.board.wake)
            seen = -1
            while not self.board.closed:
                reading = self.board.wait(seen, RESEND_SECONDS)
                if not context.is_active() or self.board.closed:
                    break
                seen = reading.version
                yield self._response(reading)
        finally:
            self.streams.release()


def _listen(socket: Path, add: list[Any]) -> grpc.Server:
    """A server on a unix socket (a stale socket file from a killed run is replaced)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
    for adder in add:
        adder(server)
    if server.add_insecure_port(f"unix://{socket}") == 0:
        raise SocketError(f"cannot listen on the DRA socket {socket}")
    server.start()
    return server


PLUGIN_LOCK = "plugin.lock"


def own_plugin_dir(plugin_dir: Path) -> int:
    """Take `<plugin dir>/plugin.lock` (an flock held for the plugin's life, this process's pid
    written in it); returns its descriptor. Raises LockHeld naming the pid that holds it (one
    agent serves a plugin directory at a time), ConfigError/AgentError when it cannot be made."""
    path = plugin_dir / PLUGIN_LOCK
    fd = open_lock_file(path, "the DRA plugin lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LockHeld(
                f"another nodeagent (pid {holder}) serves the DRA plugin directory {plugin_dir};"
                " one agent per plugin directory: stop it first"
            ) from err
        raise LockError(f"cannot lock {path}: {err.strerror}") from err
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class KubeletPluginServer:
    """The registration and DRA services, started and stopped together, by the one agent
    that holds the plugin directory's lock."""

    def __init__(
        self, node: NodeDriver, api: DraApi, driver: str, sockets: Sockets,
        board: HealthBoard | None = None,
    ) -> None:  # fmt: skip
        self.sockets = sockets
        self.registration = Registration(driver, sockets.plugin)
        slots = threading.Semaphore(PREPARE_SLOTS)  # both API versions share them
        reports = StatusReports(api, driver, node.config.pool, node.stats)
        self.v1 = DraService(node, api, dra_v1_pb2, slots, reports)
        self.v1beta1 = DraService(node, api, dra_v1beta1_pb2, slots, reports)
        self.board = board or HealthBoard()
        streams = threading.Semaphore(HEALTH_STREAMS)
        self.health = {
            name: (HealthService(self.board, node.config.pool, pb, streams), pb_grpc)
            for name, (pb, pb_grpc) in HEALTH.items()
        }
        self._servers: list[grpc.Server] = []
        self._lock_fd: int | None = None
        self._made: dict[Path, int] = {}  # the sockets this server bound: path -> inode

    def start(self) -> None:
        """Take the plugin directory, then serve DRA, then registration: the kubelet dials the
        endpoint as soon as it sees the registration socket. Raises LockHeld when another agent
        serves the directory (nothing of its is touched), KubeError when a socket cannot be
        made."""
        self._lock_fd = own_plugin_dir(self.sockets.plugin.parent)
        try:
            self._servers.append(
                _listen(
                    self.sockets.plugin,
                    [
                        lambda s: dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self.v1, s),
                        lambda s: dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                            self.v1beta1, s
                        ),
                        *(
                            lambda s, h=h, g=g: g.add_DRAResourceHealthServicer_to_server(h, s)
                            for h, g in self.health.values()
                        ),
                    ],
                )
            )
            self._remember(self.sockets.plugin)
            self._servers.append(
                _listen(
                    self.sockets.registration,
                    [
                        lambda s: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
                            self.registration, s
                        )
                    ],
                )
            )
            self._remember(self.sockets.registration)
        except (OSError, RuntimeError) as err:
            self.stop()
            raise SocketError(f"cannot start the DRA plugin's gRPC services: {err}") from err
        log.info("dra.serving", plugin=str(self.sockets.plugin))

    def _remember(self, socket: Path) -> None:
        with contextlib.suppress(OSError):
            self._made[socket] = socket.stat().st_ino

    def stop(self) -> None:
        """Registration first (the kubelet stops calling), then the DRA service; then the
        sockets this server made, only if they are still its own (a newer agent's are left)."""
        self.board.close()  # the health streams end at once, not after the grace period
        for server in reversed(self._servers):
            server.stop(grace=2).wait(5)
        self._servers.clear()
        for socket, inode in self._made.items():
            with contextlib.suppress(OSError):
                if socket.stat().st_ino == inode:
                    socket.unlink()
        self._made.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the flock goes with it
            self._lock_fd = None
