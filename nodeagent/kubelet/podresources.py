"""Which GPUs and MIG devices pods hold: the kubelet pod-resources API (gRPC List).

One List answers two questions: which container holds each device (the attribution series),
and which devices are in use (a slice a pod was allocated counts as in use even when no process
runs on it). Device ids are GPU or MIG UUIDs; shared devices (time-slicing, MPS) come as
`<uuid>::<n>` replicas.

The call is grpcio's, with the messages generated from the kubelet's v1 api.proto
(kube/proto/podresources.proto, `make proto`), the same gRPC stack as the DRA plugin: one
channel a call (the kubelet may restart between refreshes), answers up to gRPC's default
4 MiB (a node's pods take a few KiB each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from nodeagent.base.errors import KubeError
from nodeagent.kubelet.proto import podresources_pb2
from nodeagent.state.snapshot import Holder, in_use_view

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
LIST = "/v1.PodResourcesLister/List"  # the service and method of podresources.proto
pb: Any = podresources_pb2  # generated: its message classes are made when it loads
# No proxy for a unix socket (an http_proxy in the agent's environment must not apply), and
# no retry of a call that failed: the next refresh asks again.
CHANNEL_OPTIONS = (("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0))


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
        with grpc.insecure_channel(f"unix://{socket}", options=CHANNEL_OPTIONS) as channel:
            # The answer comes as bytes and is parsed here: a malformed one is then this
            # module's sentence, not grpcio's "Exception deserializing response!" logged with
            # a traceback.
            reply = channel.unary_unary(
                LIST, request_serializer=pb.ListPodResourcesRequest.SerializeToString
            )(pb.ListPodResourcesRequest(), timeout=timeout_seconds)
    except grpc.RpcError as err:
        raise KubeError(
            f"kubelet pod-resources List on {socket} failed: {_status(err, timeout_seconds)}"
        ) from err
    try:
        if not isinstance(reply, bytes):  # grpcio's answer to a cut-off message frame
            raise DecodeError("no whole message came")
        return gpu_holders(pb.ListPodResourcesResponse.FromString(reply))
    except (DecodeError, UnicodeDecodeError) as err:
        raise KubeError(
            f"kubelet pod-resources List on {socket} failed: INTERNAL the answer is not a"
            f" ListPodResourcesResponse: {err}"
        ) from err


def _status(err: grpc.RpcError, timeout_seconds: float) -> str:
    """'CODE details' of a failed call, as grpcio reports it."""
    code = err.code() if isinstance(err, grpc.Call) else None
    details = (err.details() if isinstance(err, grpc.Call) else None) or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"no answer within {timeout_seconds:g} s"
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return f"{name} {details}".strip()


def gpu_holders(reply: Any) -> dict[str, Holder]:
    """{device id: the container holding it} for every NVIDIA device in a List answer, in its
    order; a device id listed twice keeps its first holder."""
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
