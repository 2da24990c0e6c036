"""The fake kubelet against a small device plugin written here with the same stubs.

The plugin behaves like NVIDIA's where it matters to the kubelet side: it serves before it
registers, streams its devices and keeps the stream open, prefers its own pick, refuses ids it
does not own and, like MPS with `failRequestsGreaterThanOne`, more than one replica per container.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tests.support.fake_kubelet import api_pb2 as pb
from tests.support.fake_kubelet import api_pb2_grpc as pb_grpc
from tests.support.fake_kubelet.kubelet import FakeKubelet, FakeKubeletError
from tests.support.fake_kubelet.session import (
    DeviceSpec,
    Mount,
    PluginOptions,
    Registration,
    Session,
)

REPO = Path(__file__).resolve().parents[3]
GPU = "GPU-1cc80f35-c91b-531f-a6bc-4db77760f20e"
REPLICAS = [f"{GPU}::{i}" for i in range(4)]
PIPE = "/mps/example.com/gpu/pipe"


class MiniPlugin(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    """A device plugin for `example.com/gpu`: four MPS replicas of one GPU, one more unhealthy."""

    def __init__(
        self,
        plugin_dir: Path,
        *,
        preferred: bool = True,
        pre_start: bool = False,
        max_per_container: int | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.options = pb.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        self.devices = [pb.Device(ID=i, health="Healthy") for i in REPLICAS]
        self.devices.append(pb.Device(ID=f"{GPU}::4", health="Unhealthy"))
        self.max_per_container = max_per_container
        self.pre_started: list[list[str]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{plugin_dir / 'mini-gpu.sock'}")
        self.server.start()

    def register(self, version: str = "v1beta1", resource: str = "example.com/gpu") -> None:
        """Register with the kubelet socket in `plugin_dir`; raises grpc.RpcError if refused."""
        with grpc.insecure_channel(f"unix:{self.plugin_dir / 'kubelet.sock'}") as channel:
            request = pb.RegisterRequest(
                version=version, endpoint="mini-gpu.sock", resource_name=resource
            )
            request.options.CopyFrom(self.options)
            pb_grpc.RegistrationStub(channel).Register(request, timeout=5)

    def GetDevicePluginOptions(self, request: pb.Empty, context: object) -> pb.DevicePluginOptions:
        return self.options

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        gone = threading.Event()
        context.add_callback(gone.set)
        yield pb.ListAndWatchResponse(devices=self.devices)
        gone.wait()  # the kubelet keeps watching until it hangs up

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: object
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=sorted(r.available_deviceIDs, reverse=True)[: r.allocation_size]
                )
                for r in request.container_requests
            ]
        )

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        known = {d.ID for d in self.devices}
        answers = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            if not set(ids) <= known:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {ids}")
            if self.max_per_container is not None and len(ids) > self.max_per_container:
                context.abort(grpc.StatusCode.UNKNOWN, f"request for {len(ids)} replicas")
            answers.append(
                pb.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": GPU, "CUDA_MPS_PIPE_DIRECTORY": PIPE},
                    mounts=[
                        pb.Mount(container_path=PIPE, host_path="/run/nvidia/mps/pipe"),
                        pb.Mount(container_path="/dev/shm", host_path="/run/nvidia/mps/shm"),
                        pb.Mount(container_path="/etc/mps.conf", host_path="/m", read_only=True),
                    ],
                    devices=[
                        pb.DeviceSpec(
                            container_path="/dev/nvidia0",
                            host_path="/dev/nvidia0",
                            permissions="rw",
                        )
                    ],
                )
            )
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: object
    ) -> pb.PreStartContainerResponse:
        self.pre_started.append(list(request.devices_ids))
        return pb.PreStartContainerResponse()


@pytest.fixture
def plugins() -> Iterator[list[MiniPlugin]]:
    started: list[MiniPlugin] = []
    yield started
    for plugin in started:
        plugin.server.stop(grace=None)


@pytest.fixture
def kubelet(tmp_path: Path, plugins: list[MiniPlugin]) -> Iterator[FakeKubelet]:
    """Stops before the plugins do, as a kubelet hangs up on plugins that still run."""
    with FakeKubelet(tmp_path, dial_timeout_seconds=0.5) as k:
        yield k


def _session(kubelet: FakeKubelet, plugin: MiniPlugin, allocate: int) -> Session:
    plugin.register()
    registration = kubelet.wait_for_registration(timeout_seconds=2)
    return kubelet.drive(registration.resource_name, allocate, timeout_seconds=2)


def test_registers_lists_and_allocates_the_plugins_preferred_devices(
    kubelet: FakeKubelet, tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path))
    session = _session(kubelet, plugin, allocate=2)

    assert session.registration == Registration(
        "v1beta1", "mini-gpu.sock", "example.com/gpu", PluginOptions(False, True)
    )
    assert session.options == PluginOptions(False, True)
    assert [(d.id, d.health) for d in session.devices] == [
        *((i, "Healthy") for i in REPLICAS),
        (f"{GPU}::4", "Unhealthy"),
    ]
    # The plugin prefers the highest replicas among the healthy ones, and the kubelet follows.
    assert session.preferred_device_ids == (REPLICAS[3], REPLICAS[2])
    assert session.allocation is not None
    assert session.allocation.device_ids == (REPLICAS[3], REPLICAS[2])
    assert session.allocation.envs == {
        "CUDA_MPS_PIPE_DIRECTORY": PIPE,
        "NVIDIA_VISIBLE_DEVICES": GPU,
    }
    assert session.allocation.mounts == (
        Mount("/run/nvidia/mps/pipe", PIPE, False),
        Mount("/run/nvidia/mps/shm", "/dev/shm", False),
        Mount("/m", "/etc/mps.conf", True),
    )
    assert session.allocation.devices == (DeviceSpec("/dev/nvidia0", "/dev/nvidia0", "rw"),)
    assert session.pre_start_called is False
    assert json.loads(json.dumps(session.to_dict()))["allocation"]["mounts"][2] == {
        "host_path": "/m",
        "container_path": "/etc/mps.conf",
        "read_only": True,
    }


def test_without_a_preference_the_kubelet_picks_healthy_devices_and_pre_starts(
    kubelet: FakeKubelet, tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path, preferred=False, pre_start=True))
    session = _session(kubelet, plugin, allocate=1)

    assert session.preferred_device_ids is None
    assert session.allocation is not None
    assert session.allocation.device_ids == (REPLICAS[0],)
    assert session.pre_start_called is True
    assert plugin.pre_started == [[REPLICAS[0]]]


@pytest.mark.parametrize(
    ("version", "resource", "reason"),
    [
        ("v1alpha1", "example.com/gpu", "API version 'v1alpha1' is not supported"),
        ("v1beta1", "gpu", "not of the form <domain>/<name>"),
        ("v1beta1", "kubernetes.io/gpu", "kubernetes.io domain"),
        ("v1beta1", "Example_com/gpu", "not a DNS subdomain"),
    ],
)
def test_refuses_a_bad_registration(
    kubelet: FakeKubelet,
    tmp_path: Path,
    plugins: list[MiniPlugin],
    version: str,
    resource: str,
    reason: str,
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path))
    with pytest.raises(grpc.RpcError) as refused:
        plugin.register(version, resource)
    assert reason in refused.value.details()
    assert kubelet.registrations() == []
    assert len(kubelet.rejected) == 1


def test_refuses_a_plugin_whose_endpoint_does_not_answer(tmp_path: Path) -> None:
    request = pb.RegisterRequest(
        version="v1beta1", endpoint="absent.sock", resource_name="example.com/gpu"
    )
    with (
        FakeKubelet(tmp_path, dial_timeout_seconds=0.1) as kubelet,
        grpc.insecure_channel(f"unix:{kubelet.socket_path}") as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
    assert refused.value.details() == f"cannot dial the plugin at {tmp_path / 'absent.sock'}"
    assert kubelet.registrations() == []


def test_asking_for_more_than_the_healthy_devices_fails(
    kubelet: FakeKubelet, tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path))
    with pytest.raises(FakeKubeletError, match="5 devices asked for, 4 healthy of 5"):
        _session(kubelet, plugin, allocate=5)


def test_a_plugin_refusing_the_allocation_is_an_error(
    kubelet: FakeKubelet, tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path, max_per_container=1))
    with pytest.raises(FakeKubeletError, match="Allocate: UNKNOWN: request for 2 replicas"):
        _session(kubelet, plugin, allocate=2)


def test_allocates_the_devices_asked_for(
    kubelet: FakeKubelet, tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    plugins.append(plugin := MiniPlugin(tmp_path, max_per_container=1))
    plugin.register()
    kubelet.wait_for_registration(timeout_seconds=2)
    allocation = kubelet.allocate("example.com/gpu", [REPLICAS[2]], timeout_seconds=2)
    assert allocation.device_ids == (REPLICAS[2],)
    assert allocation.envs == {"CUDA_MPS_PIPE_DIRECTORY": PIPE, "NVIDIA_VISIBLE_DEVICES": GPU}
    with pytest.raises(FakeKubeletError, match="Allocate: INVALID_ARGUMENT: unknown devices"):
        kubelet.allocate("example.com/gpu", ["GPU-x::0"], timeout_seconds=2)
    with pytest.raises(FakeKubeletError, match=r"no plugin registered example\.com/other"):
        kubelet.allocate("example.com/other", [REPLICAS[0]], timeout_seconds=2)


def _cli(plugin_dir: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.support.fake_kubelet", "--dir", str(plugin_dir), *args]
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_cli_waits_for_the_plugin_and_prints_json(
    tmp_path: Path, plugins: list[MiniPlugin]
) -> None:
    cli = _cli(tmp_path, "--timeout", "10", "--allocate", "1", "--json")
    assert cli.stderr is not None
    assert cli.stderr.readline() == f"fake-kubelet: listening on {tmp_path / 'kubelet.sock'}\n"
    plugins.append(plugin := MiniPlugin(tmp_path))
    plugin.register()
    out, err = cli.communicate(timeout=10)

    assert cli.returncode == 0, err
    result = json.loads(out)
    assert result["registration"]["resource_name"] == "example.com/gpu"
    assert [d["id"] for d in result["devices"]] == [*REPLICAS, f"{GPU}::4"]
    assert result["allocation"]["device_ids"] == [REPLICAS[3]]
    assert result["allocation"]["envs"]["CUDA_MPS_PIPE_DIRECTORY"] == PIPE
    assert result["allocation"]["mounts"][0] == {
        "host_path": "/run/nvidia/mps/pipe",
        "container_path": PIPE,
        "read_only": False,
    }
    assert not (tmp_path / "kubelet.sock").exists()


def test_cli_without_a_plugin_times_out(tmp_path: Path) -> None:
    cli = _cli(tmp_path, "--timeout", "0.2")
    out, err = cli.communicate(timeout=10)
    assert cli.returncode == 1
    assert out == ""
    assert "no device plugin registered any resource" in err
