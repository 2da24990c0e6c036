"""The pod-resources client (grpcio) against a real grpcio server that fails,
stalls or answers too much, and against sockets that do not speak gRPC at all: each is one
KubeError naming the gRPC status, never a hang or a traceback."""

from __future__ import annotations

import socket as sockets
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from nodeagent.base.errors import KubeError
from nodeagent.kubelet.podresources import pod_devices
from nodeagent.kubelet.proto import podresources_pb2 as pb
from nodeagent.state.snapshot import Holder
from tests.support.fake_kubelet.podresources import pod, serve

MIG = "MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757"


@contextmanager
def raw_list(socket: Path, handler: Callable[[Callable[[], bytes]], bytes]) -> Iterator[None]:
    """A real gRPC server on `socket` whose List answers `handler(wait)`'s bytes as they are
    (no protobuf encoding); `wait()` blocks until the test is over."""
    over = threading.Event()

    def wait() -> bytes:
        over.wait(30)
        return b""

    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        return handler(wait)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    method = grpc.unary_unary_rpc_method_handler(answer)  # bytes in, bytes out
    generic = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": method})
    server.add_generic_rpc_handlers((generic,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield
    finally:
        over.set()
        server.stop(0)


@contextmanager
def not_grpc(socket: Path, reply: bytes | None) -> Iterator[None]:
    """A unix socket server that is not gRPC: it reads what it is sent and answers `reply`
    then closes, or with None says nothing until the test is over."""
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    listener.bind(str(socket))
    listener.listen(1)
    over = threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if reply is None:
                over.wait(30)
            else:
                conn.sendall(reply)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        over.set()
        thread.join(30)
        listener.close()


@pytest.mark.parametrize(
    "status",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ],
)
def test_a_server_error_names_its_status_and_message(
    tmp_path: Path, status: grpc.StatusCode
) -> None:
    socket = tmp_path / "kubelet.sock"
    with serve(socket) as kubelet:
        kubelet.error = status
        with pytest.raises(KubeError) as err:
            pod_devices(socket)
    assert str(err.value) == (
        f"kubelet pod-resources List on {socket} failed: {status.name} the kubelet is restarting"
    )


def test_a_percent_encoded_grpc_message_is_decoded(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "100% busy: 'nvidia.com/gpu' später")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    generic = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(handler)}
    )
    server.add_generic_rpc_handlers((generic,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        with pytest.raises(
            KubeError, match=r"FAILED_PRECONDITION 100% busy: 'nvidia\.com/gpu' später$"
        ):
            pod_devices(socket)
    finally:
        server.stop(0)


def test_a_server_without_the_service_is_unimplemented(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        with pytest.raises(KubeError, match="failed: UNIMPLEMENTED"):
            pod_devices(socket)
    finally:
        server.stop(0)


def test_a_kubelet_that_does_not_answer_in_time(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    with raw_list(socket, lambda wait: wait()), pytest.raises(KubeError) as err:
        pod_devices(socket, timeout_seconds=0.5)
    assert "failed: DEADLINE_EXCEEDED" in str(err.value)


def test_a_socket_that_never_answers_times_out(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    with not_grpc(socket, None), pytest.raises(KubeError) as err:
        pod_devices(socket, timeout_seconds=0.5)
    assert str(err.value).endswith("failed: DEADLINE_EXCEEDED no answer within 0.5 s")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
            r"failed: UNAVAILABLE .*Trying to connect an http1\.x server \(HTTP status 400\)",
        ),
        (b"", "failed: UNAVAILABLE .*Socket closed$"),
    ],
)
def test_a_socket_that_is_not_grpc(tmp_path: Path, reply: bytes, expected: str) -> None:
    socket = tmp_path / "kubelet.sock"
    with not_grpc(socket, reply), pytest.raises(KubeError, match=expected):
        pod_devices(socket)


@pytest.mark.parametrize(
    "answer",
    [
        b"\xff\xff\xff",  # a varint that never ends
        b"\x0a\x10abc",  # a pod of 16 bytes, 3 sent
        b"\x0a\x04\x0a\x02\xc3\x28",  # a pod name that is not UTF-8
        b"\x0b",  # a group (wire type 3): proto3 never writes one
    ],
)
def test_a_garbage_message_is_an_error(tmp_path: Path, answer: bytes) -> None:
    socket = tmp_path / "kubelet.sock"
    with raw_list(socket, lambda wait: answer), pytest.raises(KubeError) as err:
        pod_devices(socket)
    assert "the answer is not a ListPodResourcesResponse" in str(err.value)


def _pods(n: int) -> list[pb.PodResources]:
    return [
        pod("batch", f"job-{i:06d}", {"main": {"nvidia.com/gpu": [f"GPU-{i:032x}"]}})
        for i in range(n)
    ]


def test_an_answer_over_4_mib_is_refused(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    with serve(socket) as kubelet:
        kubelet.pods = _pods(60_000)  # 5.2 MiB encoded
        assert pb.ListPodResourcesResponse(pod_resources=kubelet.pods).ByteSize() > 4 << 20
        with pytest.raises(
            KubeError,
            match=r"failed: RESOURCE_EXHAUSTED .*larger than max \(5100000 vs\. 4194304\)",
        ):
            pod_devices(socket)


def test_a_large_answer_past_the_flow_control_window(tmp_path: Path) -> None:
    """1 MiB: 16 times HTTP/2's initial window, so the client must hand the window back."""
    socket = tmp_path / "kubelet.sock"
    with serve(socket) as kubelet:
        kubelet.pods = [
            *_pods(13_000),
            pod("speech", "asr-0", {"server": {"nvidia.com/mig-1g.18gb": [MIG]}}),
        ]
        assert pb.ListPodResourcesResponse(pod_resources=kubelet.pods).ByteSize() > 1 << 20
        held = pod_devices(socket)
    assert len(held) == 13_001
    assert held[f"GPU-{11_999:032x}"] == Holder("batch", "job-011999", "main")
    assert held[MIG] == Holder("speech", "asr-0", "server")
