"""The kubelet's pod-resources API (`v1.PodResourcesLister`) on a unix socket, answering `List`
with the pods a test sets, or with the gRPC error it sets (as a kubelet that is restarting)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc

from nodeagent.kubelet.proto import podresources_pb2 as pb
from nodeagent.kubelet.proto import podresources_pb2_grpc as pb_grpc

# {container: {resource name: [device ids]}}
Containers = Mapping[str, Mapping[str, Sequence[str]]]


def pod(namespace: str, name: str, containers: Containers) -> pb.PodResources:
    """A pod as the kubelet lists it: its containers and the devices each was allocated."""
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=container,
                devices=[
                    pb.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in devices.items()
                ],
            )
            for container, devices in containers.items()
        ],
    )


class FakePodResources(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """`pods`: what List answers; `error`: when set, List fails with that status instead.
    `calls` counts List calls."""

    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = []
        self.error: grpc.StatusCode | None = None
        self.calls = 0
        self._lock = threading.Lock()

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            error, pods = self.error, list(self.pods)
        if error is not None:
            context.abort(error, "the kubelet is restarting")  # raises
        return pb.ListPodResourcesResponse(pod_resources=pods)


@contextmanager
def serve(socket: Path) -> Iterator[FakePodResources]:
    """Serve a FakePodResources on `socket` (removed afterwards)."""
    service = FakePodResources()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield service
    finally:
        server.stop(0)
        socket.unlink(missing_ok=True)
