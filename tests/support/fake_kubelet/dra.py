"""The kubelet's side of DRA, enough to drive a real DRA kubelet plugin.

As the kubelet's plugin watcher does (kubernetes/kubernetes pkg/kubelet/pluginmanager), it
dials `<registry dir>/<driver>-reg.sock`, calls `Registration.GetInfo`, checks the answer (type
DRAPlugin, the driver's name, an endpoint it can dial, a service version it speaks: it prefers
v1.DRAPlugin and falls back to v1beta1.DRAPlugin, as the kubelet's DRA manager does), and tells
the plugin with `NotifyRegistrationStatus`. `prepare()` and `unprepare()` then call
NodePrepareResources / NodeUnprepareResources for a list of claims, over the version chosen.
`watch_health()` opens the resource-health stream (DRAResourceHealth.NodeWatchResources) as
the kubelet's health manager does: over the newest version the registration advertised
(pickHealthService: v1 before v1alpha1), or v1alpha1 when it advertised none, as 1.34's kubelet
calls it unconditionally; `health=` forces one.
The protocol is kubernetes/kubelet@63b3249724f7d89a8aa48f9acb3811f193c9aa68:
pkg/apis/dra/{v1,v1beta1}/api.proto, pkg/apis/pluginregistration/v1/api.proto and
pkg/apis/dra/{v1,v1beta1}/types.go (the service names).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

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

VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
HEALTH: dict[str, tuple[ModuleType, ModuleType]] = {  # most preferred first
    "v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1beta1.DRAResourceHealth": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}
TIMEOUT_SECONDS = 30.0


class FakeKubeletError(Exception):
    """A plugin that did not register or broke the protocol."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    health: str  # HEALTHY, UNHEALTHY, UNKNOWN
    message: str  # '' over v1alpha1, which has none
    last_updated: int


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class FakeDraKubelet:
    """Registers one DRA plugin found in `registry_dir`, then prepares and unprepares claims.
    `speaks` is the service versions this kubelet knows, most preferred first."""

    def __init__(self, registry_dir: Path, speaks: tuple[str, ...] = tuple(VERSIONS)) -> None:
        self.timeout_seconds = TIMEOUT_SECONDS  # each call's gRPC deadline (the kubelet's: 45 s)
        self.registry_dir = registry_dir
        self.speaks = speaks
        self.endpoint: Path | None = None
        self.version = ""
        self.advertised: tuple[str, ...] = ()

    def register(self, driver: str) -> str:
        """Register the plugin of `driver`; returns the service version chosen. Raises
        FakeKubeletError (after telling the plugin, as the kubelet does) when it cannot."""
        socket = self.registry_dir / f"{driver}-reg.sock"
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=TIMEOUT_SECONDS)
            error = self._check(info, driver)
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=not error, error=error),
                timeout=TIMEOUT_SECONDS,
            )
        if error:
            raise FakeKubeletError(error)
        return self.version

    def _check(self, info: pluginregistration_pb2.PluginInfo, driver: str) -> str:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if info.name != driver:
            return f"plugin name {info.name!r} is not the driver {driver!r}"
        common = [v for v in self.speaks if v in info.supported_versions]
        if not common:
            return f"none of the versions {list(info.supported_versions)} is supported"
        endpoint = Path(info.endpoint)
        if not endpoint.is_socket():
            return f"endpoint {endpoint} is no socket"
        self.endpoint, self.version = endpoint, common[0]
        self.advertised = tuple(info.supported_versions)
        return ""

    def _call(self, method: str, claims: list[Claim]) -> Any:
        """One DRAPlugin call (`NodePrepareResources`, `NodeUnprepareResources`) for `claims`
        over the version chosen at registration; the reply. Every claim must be answered."""
        if self.endpoint is None:
            raise FakeKubeletError("no plugin registered")
        pb, pb_grpc = VERSIONS[self.version]
        with grpc.insecure_channel(f"unix://{self.endpoint}") as channel:
            request = getattr(pb, f"{method}Request")(
                claims=[pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
            )
            stub = pb_grpc.DRAPluginStub(channel)
            reply = getattr(stub, method)(request, timeout=self.timeout_seconds)
        missing = {c.uid for c in claims} - set(reply.claims)
        if missing:
            raise FakeKubeletError(f"the plugin answered nothing for claims {sorted(missing)}")
        return reply

    def prepare(self, claims: list[Claim]) -> dict[str, PrepareResult]:
        """NodePrepareResources for `claims`: each claim UID's devices or error."""
        reply = self._call("NodePrepareResources", claims)
        out = {}
        for uid, answer in reply.claims.items():
            devices = tuple(
                PreparedDevice(
                    tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)
                )
                for d in answer.devices
            )
            out[uid] = PrepareResult(devices, answer.error)
        return out

    def unprepare(self, claims: list[Claim]) -> dict[str, str]:
        """NodeUnprepareResources for `claims`: each claim UID's error ('' when done)."""
        reply = self._call("NodeUnprepareResources", claims)
        return {uid: answer.error for uid, answer in reply.claims.items()}

    def health_version(self) -> str:
        """The health service the kubelet would call: the newest one advertised, else
        v1alpha1 (a 1.34 kubelet calls it whatever the plugin advertised)."""
        return next((v for v in HEALTH if v in self.advertised), "v1alpha1.DRAResourceHealth")

    def watch_health(
        self, timeout_seconds: float = TIMEOUT_SECONDS, health: str | None = None
    ) -> Iterator[dict[str, DeviceHealth]]:
        """The health stream: each message as {device name: DeviceHealth}, until the plugin
        ends it or `timeout_seconds` pass (grpc.RpcError DEADLINE_EXCEEDED). Close the
        iterator to hang up."""
        if self.endpoint is None:
            raise FakeKubeletError("no plugin registered")
        pb, pb_grpc = HEALTH[health or self.health_version()]
        with grpc.insecure_channel(f"unix://{self.endpoint}") as channel:
            stub = pb_grpc.DRAResourceHealthStub(channel)
            stream = stub.NodeWatchResources(
                pb.NodeWatchResourcesRequest(), timeout=timeout_seconds
            )
            try:
                for reply in stream:
                    yield {
                        d.device.device_name: DeviceHealth(
                            d.device.pool_name,
                            pb.HealthStatus.Name(d.health),
                            getattr(d, "message", ""),
                            d.last_updated_time,
                        )
                        for d in reply.devices
                    }
            finally:
                stream.cancel()
