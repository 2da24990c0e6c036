"""Which GPUs and MIG devices pods hold: the kubelet pod-resources API (gRPC List).

One List answers two questions: which container holds each device (the attribution series),
and which devices are in use (a slice a pod was allocated counts as in use even when no process
runs on it). Device ids are GPU or MIG UUIDs; shared devices (time-slicing, MPS) come as
`<uuid>::<n>` replicas.

The call goes through kube/grpcunary.py (HTTP/2 on h2) and the answer is read with
kube/protowire.py, not grpcio and protobuf: together 15 MiB less RSS for the --kube agent.
The fields read are those of v1's api.proto (kube/proto/podresources.proto):
ListPodResourcesResponse.pod_resources = 1; PodResources.name = 1, .namespace = 2,
.containers = 3; ContainerResources.name = 1, .devices = 2; ContainerDevices.resource_name = 1,
.device_ids = 2. Others (cpu ids, topology, memory, dynamic resources) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from nodeagent.errors import KubeError
from nodeagent.kube.grpcunary import CallError, unary_call
from nodeagent.kube.protowire import WireError, strings_and_messages, text
from nodeagent.snapshot import Holder, in_use_view

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
LIST = "/v1.PodResourcesLister/List"


def pod_devices(socket: Path, timeout_seconds: float = 5.0) -> dict[str, Holder]:
    """{device id: the container holding it} for every NVIDIA GPU, MIG device or replica pods
    hold, in the kubelet's order, from one List call. A device id listed twice keeps its first
    holder.

    Raises KubeError when the kubelet cannot be asked or its answer cannot be read: without
    the answer, nodeagent cannot know which slices are safe to destroy.
    """
    if not socket.exists():
        raise KubeError(f"kubelet pod-resources socket {socket} does not exist")
    try:
        # ListPodResourcesRequest has no fields: its encoding is empty
        return gpu_holders(unary_call(socket, LIST, b"", timeout_seconds))
    except CallError as err:
        raise KubeError(f"kubelet pod-resources List on {socket} failed: {err}") from err
    except WireError as err:
        raise KubeError(
            f"kubelet pod-resources List on {socket} failed: the answer is not a"
            f" ListPodResourcesResponse: {err}"
        ) from err


def gpu_holders(reply: bytes) -> dict[str, Holder]:
    """{device id: the container holding it} for every NVIDIA device in an encoded
    ListPodResourcesResponse, in its order; a device id listed twice keeps its first holder.
    Raises WireError when `reply` is not a well-formed message."""
    held: dict[str, Holder] = {}
    for holder, device_id in _gpu_devices(reply):
        held.setdefault(device_id, holder)
    return held


def _gpu_devices(reply: bytes) -> Iterator[tuple[Holder, str]]:
    """(holder, device id) for each NVIDIA device in an encoded ListPodResourcesResponse."""
    for number, pod in strings_and_messages(reply):
        if number != 1:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for field, value in strings_and_messages(pod):
            if field == 1:
                name = text(value)
            elif field == 2:
                namespace = text(value)
            elif field == 3:
                containers.append(value)
        for container in containers:
            yield from _container_devices(namespace, name, container)


def _container_devices(namespace: str, pod: str, data: bytes) -> Iterator[tuple[Holder, str]]:
    name = ""
    groups: list[tuple[str, list[str]]] = []
    for field, value in strings_and_messages(data):
        if field == 1:
            name = text(value)
        elif field == 2:
            resource, ids = "", []
            for device_field, item in strings_and_messages(value):
                if device_field == 1:
                    resource = text(item)
                elif device_field == 2:
                    ids.append(text(item))
            groups.append((resource, ids))
    holder = Holder(namespace, pod, name)
    for resource, ids in groups:
        if resource.startswith(GPU_RESOURCES):
            for device_id in ids:
                yield holder, device_id


def allocated_devices(socket: Path, timeout_seconds: float = 5.0) -> dict[str, str]:
    """{device UUID: 'pod NAMESPACE/NAME'} for every NVIDIA GPU or MIG device pods hold (the
    in-use view of `pod_devices`). Raises KubeError as `pod_devices` does."""
    return in_use_view(pod_devices(socket, timeout_seconds))
