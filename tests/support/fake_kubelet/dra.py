"""The kubelet's side of DRA, enough to drive a real DRA kubelet plugin.

As the kubelet's plugin watcher does (kubernetes/kubernetes pkg/kubelet/pluginmanager), it
dials `<registry dir>/<driver>-reg.sock`, calls `Registration.GetInfo`, checks the answer (type
DRAPlugin, the driver's name, an endpoint it can dial, a service version it speaks: it prefers
v1.DRAPlugin and falls back to v1beta1.DRAPlugin, as the kubelet's DRA manager does), and tells
the plugin with `NotifyRegistrationStatus`. `prepare()` and `unprepare()` then call
NodePrepareResources / NodeUnprepareResources for a list of claims, over the version chosen.
The protocol is kubernetes/kubelet@63b3249724f7d89a8aa48f9acb3811f193c9aa68:
pkg/apis/dra/{v1,v1beta1}/api.proto, pkg/apis/pluginregistration/v1/api.proto and
pkg/apis/dra/{v1,v1beta1}/types.go (the service names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from nodeagent.kubelet.proto import (
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
