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
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.errors import AgentError, KubeError
from nodeagent.kube.dra_api import DraApi
from nodeagent.kube.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from nodeagent.logs import get_logger

log = get_logger("nodeagent.dra")
PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


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
            supported_versions=list(SERVICES),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
            log.info("dra.registered", driver=self.driver)
        else:
            log.error("dra.registration_failed", driver=self.driver, error=request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()  # type: ignore[attr-defined]


class DraService:
    """NodePrepareResources / NodeUnprepareResources for one version of the API (`pb`)."""

    def __init__(self, node: NodeDriver, api: DraApi, pb: ModuleType) -> None:
        self.node = node
        self.api = api
        self.pb = pb

    def _prepare_one(self, claim: Any) -> Any:
        ref = ClaimRef(claim.namespace, claim.name, claim.uid)
        try:
            obj = self.api.read_claim(ref.namespace, ref.name)
            if obj is None:
                raise KubeError(f"{ref} does not exist")
            uid = (obj.get("metadata") or {}).get("uid")
            if uid != ref.uid:
                raise KubeError(f"{ref} has UID {uid}, not {ref.uid}: it was replaced")
            prepared = self.node.prepare(ref, obj)
        except AgentError as err:
            log.warning("dra.prepare_failed", claim=str(ref), error=str(err))
            return self.pb.NodePrepareResourceResponse(error=f"{ref}: {err}")
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

    def _unprepare_one(self, claim: Any) -> Any:
        ref = ClaimRef(claim.namespace, claim.name, claim.uid)
        try:
            self.node.unprepare(ref.uid)
        except AgentError as err:
            log.warning("dra.unprepare_failed", claim=str(ref), error=str(err))
            return self.pb.NodeUnprepareResourceResponse(error=f"{ref}: {err}")
        return self.pb.NodeUnprepareResourceResponse()

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        answers = {c.uid: self._prepare_one(c) for c in request.claims}
        return self.pb.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answers = {c.uid: self._unprepare_one(c) for c in request.claims}
        return self.pb.NodeUnprepareResourcesResponse(claims=answers)


def _listen(socket: Path, add: list[Any]) -> grpc.Server:
    """A server on a unix socket (a stale socket file from a killed run is replaced)."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for adder in add:
        adder(server)
    if server.add_insecure_port(f"unix://{socket}") == 0:
        raise KubeError(f"cannot listen on the DRA socket {socket}")
    server.start()
    return server


class DraPluginServer:
    """The registration and DRA services, started and stopped together."""

    def __init__(self, node: NodeDriver, api: DraApi, driver: str, sockets: Sockets) -> None:
        self.sockets = sockets
        self.registration = Registration(driver, sockets.plugin)
        self.v1 = DraService(node, api, dra_v1_pb2)
        self.v1beta1 = DraService(node, api, dra_v1beta1_pb2)
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        """Serve DRA first, then registration: the kubelet dials the endpoint as soon as it
        sees the registration socket. Raises KubeError when a socket cannot be made."""
        try:
            self._servers.append(
                _listen(
                    self.sockets.plugin,
                    [
                        lambda s: dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(self.v1, s),
                        lambda s: dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                            self.v1beta1, s
                        ),
                    ],
                )
            )
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
        except (OSError, RuntimeError) as err:
            self.stop()
            raise KubeError(f"cannot start the DRA plugin's gRPC services: {err}") from err
        log.info("dra.serving", plugin=str(self.sockets.plugin))

    def stop(self) -> None:
        """Registration first (the kubelet stops calling), then the DRA service."""
        for server in reversed(self._servers):
            server.stop(grace=2).wait(5)
        self._servers.clear()
        self.sockets.registration.unlink(missing_ok=True)
        self.sockets.plugin.unlink(missing_ok=True)
