"""The kubelet's side of the device-plugin API v1beta1, enough to drive a real device plugin.

A `FakeKubelet` serves `Registration.Register` on a unix socket (the kubelet's
`<dir>/kubelet.sock`). Like the kubelet's device manager, it answers a registration only after
checking the API version and the resource name, dialling the plugin's endpoint
(`<dir>/<endpoint>`) and asking it for its options; a failure there is the plugin's
registration error. `drive()` then does what the kubelet does to admit a container that asks for
N devices: the first `ListAndWatch` answer, `GetPreferredAllocation` when the plugin offers it,
`Allocate`, and `PreStartContainer` when the plugin requires it. Everything comes back as plain
frozen dataclasses; `Session.to_dict()` is the JSON the CLI prints.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.support.fake_kubelet import api_pb2 as pb
from tests.support.fake_kubelet import api_pb2_grpc as pb_grpc
from tests.support.fake_kubelet.session import (
    Allocation,
    Device,
    DeviceSpec,
    Mount,
    PluginOptions,
    Registration,
    Session,
)

API_VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET_NAME = "kubelet.sock"
HEALTHY = "Healthy"
DIAL_TIMEOUT_SECONDS = 10.0  # the kubelet's own dial timeout for a plugin endpoint

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class FakeKubeletError(Exception):
    """A plugin that did not register, answered an error, or broke the protocol."""


def resource_name_error(name: str) -> str | None:
    """Why the kubelet refuses `name` as an extended resource, or None when it accepts it."""
    domain, slash, short = name.partition("/")
    if not slash or "/" in short:
        return f"resource name {name!r} is not of the form <domain>/<name>"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"resource name {name!r} is in the kubernetes.io domain"
    labels = domain.split(".")
    if len(domain) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        return f"resource name {name!r}: {domain!r} is not a DNS subdomain"
    if not _NAME.match(short):
        return f"resource name {name!r}: {short!r} is not a valid name"
    return None


def _options(message: pb.DevicePluginOptions) -> PluginOptions:
    return PluginOptions(message.pre_start_required, message.get_preferred_allocation_available)


def _rpc_error(step: str, err: grpc.RpcError) -> FakeKubeletError:
    return FakeKubeletError(f"{step}: {err.code().name}: {err.details()}")


@dataclass
class _Plugin:
    registration: Registration
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    options: PluginOptions


class FakeKubelet(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet's registration server on `socket_path` (default `<plugin_dir>/kubelet.sock`).

    Plugin endpoints are resolved in `plugin_dir`, as the kubelet resolves them in its
    device-plugins folder. Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(
        self,
        plugin_dir: Path,
        socket_path: Path | None = None,
        dial_timeout_seconds: float = DIAL_TIMEOUT_SECONDS,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.socket_path = Path(socket_path or self.plugin_dir / KUBELET_SOCKET_NAME)
        self.dial_timeout_seconds = dial_timeout_seconds
        self.rejected: list[str] = []  # why each refused registration was refused
        self._plugins: dict[str, _Plugin] = {}
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._server: grpc.Server | None = None

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Serve Registration; the socket exists when this returns."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a stale socket of an earlier run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        with self._lock:
            for plugin in self._plugins.values():
                plugin.channel.close()
            self._plugins.clear()
        self.socket_path.unlink(missing_ok=True)

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        """Accept a plugin as the kubelet does: version, name, then a working endpoint."""
        registration = Registration(
            request.version, request.endpoint, request.resource_name, _options(request.options)
        )
        try:
            plugin = self._connect(registration)
        except FakeKubeletError as err:
            with self._lock:
                self.rejected.append(str(err))
            context.abort(grpc.StatusCode.UNKNOWN, str(err))  # raises: the plugin sees the error
        with self._registered:
            old = self._plugins.pop(registration.resource_name, None)
            self._plugins[registration.resource_name] = plugin
            self._registered.notify_all()
        if old is not None:  # a re-registration replaces the earlier client, as in the kubelet
            old.channel.close()
        return pb.Empty()

    def _connect(self, registration: Registration) -> _Plugin:
        if registration.version != API_VERSION:
            raise FakeKubeletError(
                f"API version {registration.version!r} is not supported (only {API_VERSION!r})"
            )
        problem = resource_name_error(registration.resource_name)
        if problem is not None:
            raise FakeKubeletError(problem)
        endpoint = self.plugin_dir / registration.endpoint
        channel = grpc.insecure_channel(
            f"unix:{endpoint}", options=[("grpc.default_authority", "localhost")]
        )
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            # wait_for_ready: the kubelet's blocking dial, without channel_ready_future's
            # connectivity-polling thread (which makes every close() take 0.2 s).
            options = stub.GetDevicePluginOptions(
                pb.Empty(), timeout=self.dial_timeout_seconds, wait_for_ready=True
            )
        except grpc.RpcError as err:
            channel.close()
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise FakeKubeletError(f"cannot dial the plugin at {endpoint}") from None
            raise _rpc_error("GetDevicePluginOptions", err) from err
        return _Plugin(registration, channel, stub, _options(options))

    def registrations(self) -> list[Registration]:
        with self._lock:
            return [plugin.registration for plugin in self._plugins.values()]

    def wait_for_registration(
        self, timeout_seconds: float, resource_name: str | None = None
    ) -> Registration:
        """The first accepted registration (of `resource_name` if given); TimeoutError if none."""
        with self._registered:
            found = self._registered.wait_for(
                lambda: self._find(resource_name) is not None, timeout=timeout_seconds
            )
            plugin = self._find(resource_name)
        if not found or plugin is None:
            what = resource_name or "any resource"
            raise TimeoutError(
                f"no device plugin registered {what} on {self.socket_path} "
                f"within {timeout_seconds:g} s"
            )
        return plugin.registration

    def _find(self, resource_name: str | None) -> _Plugin | None:
        if resource_name is None:
            return next(iter(self._plugins.values()), None)
        return self._plugins.get(resource_name)

    def drive(self, resource_name: str, allocate: int, timeout_seconds: float) -> Session:
        """List the plugin's devices and allocate `allocate` healthy ones to one container."""
        with self._lock:
            plugin = self._plugins.get(resource_name)
        if plugin is None:
            raise FakeKubeletError(f"no plugin registered {resource_name}")
        return _drive(plugin, allocate, time.monotonic() + timeout_seconds)

    def allocate(
        self, resource_name: str, device_ids: list[str], timeout_seconds: float
    ) -> Allocation:
        """Allocate exactly `device_ids` to one container (the kubelet's call once it has
        picked them), without listing or asking for a preference first."""
        with self._lock:
            plugin = self._plugins.get(resource_name)
        if plugin is None:
            raise FakeKubeletError(f"no plugin registered {resource_name}")
        deadline = time.monotonic() + timeout_seconds
        return _allocate(plugin, device_ids, lambda: max(deadline - time.monotonic(), 0.001))


def _drive(plugin: _Plugin, allocate: int, deadline: float) -> Session:
    def remaining() -> float:
        return max(deadline - time.monotonic(), 0.001)

    stream = plugin.stub.ListAndWatch(pb.Empty(), timeout=remaining())
    try:
        try:
            first = next(stream)
        except StopIteration:
            raise FakeKubeletError("ListAndWatch ended before listing any device") from None
        except grpc.RpcError as err:
            raise _rpc_error("ListAndWatch", err) from err
        devices = tuple(
            Device(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in first.devices
        )
        preferred, chosen = _choose(plugin, devices, allocate, remaining)
        allocation = _allocate(plugin, chosen, remaining) if allocate else None
        pre_start = bool(allocate) and plugin.options.pre_start_required
        if pre_start:
            try:
                request = pb.PreStartContainerRequest(devices_ids=chosen)
                plugin.stub.PreStartContainer(request, timeout=remaining())
            except grpc.RpcError as err:
                raise _rpc_error("PreStartContainer", err) from err
    finally:
        stream.cancel()
    return Session(plugin.registration, plugin.options, devices, preferred, allocation, pre_start)


def _choose(
    plugin: _Plugin, devices: tuple[Device, ...], count: int, remaining: Callable[[], float]
) -> tuple[tuple[str, ...] | None, list[str]]:
    """The kubelet's pick: the plugin's preference among healthy devices, topped up in order."""
    healthy = sorted(d.id for d in devices if d.health == HEALTHY)
    if count > len(healthy):
        raise FakeKubeletError(
            f"{plugin.registration.resource_name}: {count} devices asked for, "
            f"{len(healthy)} healthy of {len(devices)}"
        )
    if count == 0 or not plugin.options.get_preferred_allocation_available:
        return None, healthy[:count]
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=healthy, must_include_deviceIDs=[], allocation_size=count
            )
        ]
    )
    try:
        response = plugin.stub.GetPreferredAllocation(request, timeout=remaining())
    except grpc.RpcError as err:
        raise _rpc_error("GetPreferredAllocation", err) from err
    if len(response.container_responses) != 1:
        raise FakeKubeletError(
            f"GetPreferredAllocation: {len(response.container_responses)} answers for 1 container"
        )
    preferred = tuple(response.container_responses[0].deviceIDs)
    chosen = [i for i in dict.fromkeys(preferred) if i in healthy][:count]
    chosen += [i for i in healthy if i not in chosen][: count - len(chosen)]
    return preferred, chosen


def _allocate(plugin: _Plugin, device_ids: list[str], remaining: Callable[[], float]) -> Allocation:
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)]
    )
    try:
        response = plugin.stub.Allocate(request, timeout=remaining())
    except grpc.RpcError as err:
        raise _rpc_error("Allocate", err) from err
    if len(response.container_responses) != 1:
        raise FakeKubeletError(
            f"Allocate: {len(response.container_responses)} answers for 1 container"
        )
    answer = response.container_responses[0]
    return Allocation(
        device_ids=tuple(device_ids),
        envs=dict(sorted(answer.envs.items())),
        mounts=tuple(Mount(m.host_path, m.container_path, m.read_only) for m in answer.mounts),
        devices=tuple(
            DeviceSpec(d.host_path, d.container_path, d.permissions) for d in answer.devices
        ),
        annotations=dict(sorted(answer.annotations.items())),
        cdi_devices=tuple(c.name for c in answer.cdi_devices),
    )


def run(
    plugin_dir: Path,
    timeout_seconds: float,
    allocate: int = 1,
    socket_path: Path | None = None,
    resource_name: str | None = None,
    on_listening: Callable[[], None] | None = None,
) -> Session:
    """Serve the kubelet socket until a plugin registers, drive it, stop; all within the timeout.

    `on_listening` is called once the socket is up. Raises TimeoutError when no plugin
    registers in time, FakeKubeletError when one misbehaves.
    """
    deadline = time.monotonic() + timeout_seconds
    with FakeKubelet(plugin_dir, socket_path) as kubelet:
        if on_listening is not None:
            on_listening()
        registration = kubelet.wait_for_registration(timeout_seconds, resource_name)
        left = max(deadline - time.monotonic(), 0.001)
        return kubelet.drive(registration.resource_name, allocate, left)
