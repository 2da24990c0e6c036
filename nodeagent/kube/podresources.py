"""Which GPUs and MIG devices pods hold: the kubelet pod-resources API (gRPC List).

One List answers two questions: which container holds each device (the attribution series),
and which devices are in use (a slice a pod was allocated counts as in use even when no process
runs on it). Device ids are GPU or MIG UUIDs; shared devices (time-slicing, MPS) come as
`<uuid>::<n>` replicas.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from nodeagent.errors import KubeError
from nodeagent.kube.proto import podresources_pb2, podresources_pb2_grpc
from nodeagent.snapshot import Holder, in_use_view

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


def pod_devices(socket: Path, timeout_seconds: float = 5.0) -> dict[str, Holder]:
    """{device id: the container holding it} for every NVIDIA GPU, MIG device or replica pods
    hold, in the kubelet's order, from one List call. A device id listed twice keeps its first
    holder.

    Raises KubeError when the kubelet cannot be asked: without the answer, nodeagent cannot know
    which slices are safe to destroy.
    """
    if not socket.exists():
        raise KubeError(f"kubelet pod-resources socket {socket} does not exist")
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            request = podresources_pb2.ListPodResourcesRequest()  # type: ignore[attr-defined]
            reply = stub.List(request, timeout=timeout_seconds)
    except grpc.RpcError as err:
        raise KubeError(
            f"kubelet pod-resources List on {socket} failed: {err.code().name} {err.details()}"
        ) from err
    held: dict[str, Holder] = {}
    for pod in reply.pod_resources:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if devices.resource_name.startswith(GPU_RESOURCES):
                    for device_id in devices.device_ids:
                        held.setdefault(device_id, holder)
    return held


def allocated_devices(socket: Path, timeout_seconds: float = 5.0) -> dict[str, str]:
    """{device UUID: 'pod NAMESPACE/NAME'} for every NVIDIA GPU or MIG device pods hold (the
    in-use view of `pod_devices`). Raises KubeError as `pod_devices` does."""
    return in_use_view(pod_devices(socket, timeout_seconds))
