"""The pod-resources client (grpcio) against an HTTP/2 server (h2's server side, a test tool
only) that answers what no grpcio server would send: HTTP errors, missing or odd grpc-status,
malformed message frames, refused streams. Each is one KubeError naming the gRPC status and
grpcio's reason, within the call's timeout, never a traceback."""

from __future__ import annotations

import contextlib
import socket as sockets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import StreamEnded
from h2.exceptions import ProtocolError

from nodeagent.base.errors import KubeError
from nodeagent.kubelet.podresources import pod_devices

Headers = list[tuple[bytes, bytes]]
OK = [(b":status", b"200"), (b"content-type", b"application/grpc")]


@contextmanager
def h2_answer(
    socket: Path, headers: Headers, body: bytes, trailers: Headers | None, refuse: str = ""
) -> Iterator[None]:
    """An HTTP/2 server (h2's server side) that answers the first call with `headers`, then
    `body` (raw DATA) and `trailers` where given: gRPC answers no grpcio server would send.
    `refuse`: 'reset' the call's stream or 'goaway' the connection instead."""
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    listener.bind(str(socket))
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        h2.initiate_connection()
        # grpcio hangs up (or resets what it no longer wants) as soon as it has judged the
        # answer: what this server does after that does not matter
        with conn, contextlib.suppress(OSError, ProtocolError):
            while chunk := conn.recv(65536):
                for event in h2.receive_data(chunk):
                    if isinstance(event, StreamEnded) and refuse:
                        if refuse == "reset":
                            h2.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
                        else:
                            h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
                    elif isinstance(event, StreamEnded):
                        sid = event.stream_id
                        h2.send_headers(sid, headers, end_stream=not body and trailers is None)
                        if body:
                            h2.send_data(sid, body, end_stream=trailers is None)
                        if trailers is not None:
                            h2.send_headers(sid, trailers, end_stream=True)
                conn.sendall(h2.data_to_send())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(30)
        listener.close()


@pytest.mark.parametrize(
    ("headers", "body", "trailers", "expected"),
    [
        ([(b":status", b"503")], b"", None, "UNAVAILABLE Received http2 header with status: 503"),
        ([(b":status", b"404")], b"", None, "UNIMPLEMENTED Received http2 header with status: 404"),
        (OK, b"", None, "UNKNOWN No status received"),
        (
            [*OK, (b"grpc-status", b"14"), (b"grpc-message", b"drained%20%E2%9C%93")],
            b"",
            None,
            "UNAVAILABLE drained \u2713",
        ),
        ([*OK, (b"grpc-status", b"99")], b"", None, "UNKNOWN"),
        (
            OK,
            b"\0\0\0\0\0",
            [(b"grpc-status", b"x")],
            "INTERNAL Stream removed (Error parsing 'grpc-status' metadata)",
        ),
        (
            OK,
            b"\0\0\0",
            [(b"grpc-status", b"0")],
            "INTERNAL the answer is not a ListPodResourcesResponse: no whole message came",
        ),
        (
            OK,
            b"\1\0\0\0\2ab",
            [(b"grpc-status", b"0")],
            "INTERNAL Compression bit set but no encoding configured",
        ),
        (
            OK,
            b"\0\0\0\0\x0aabc",
            [(b"grpc-status", b"0")],
            "INTERNAL the answer is not a ListPodResourcesResponse: no whole message came",
        ),
        (
            OK,
            b"\0\xff\0\0\0",
            [(b"grpc-status", b"0")],
            "RESOURCE_EXHAUSTED Stream removed (CLIENT: Received message larger than max (4278190080 vs. 4194304))",
        ),
    ],
)
def test_an_answer_no_grpc_server_would_send(
    tmp_path: Path, headers: Headers, body: bytes, trailers: Headers | None, expected: str
) -> None:
    socket = tmp_path / "kubelet.sock"
    with h2_answer(socket, headers, body, trailers), pytest.raises(KubeError) as err:
        pod_devices(socket)
    assert str(err.value).endswith(f"failed: {expected}")


@pytest.mark.parametrize(
    ("refuse", "expected"),
    [
        (
            "reset",
            "UNAVAILABLE Stream removed (RST_STREAM (Received RST_STREAM with error code 7))",
        ),
        # this server takes one connection: grpcio connects again and waits for its deadline
        ("goaway", "DEADLINE_EXCEEDED no answer within 1 s"),
    ],
)
def test_a_refused_stream_or_connection(tmp_path: Path, refuse: str, expected: str) -> None:
    socket = tmp_path / "kubelet.sock"
    with h2_answer(socket, OK, b"", None, refuse), pytest.raises(KubeError) as err:
        pod_devices(socket, timeout_seconds=1)
    assert str(err.value).endswith(f"failed: {expected}")


def test_an_empty_answer_is_no_pods(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    with h2_answer(socket, OK, b"\0\0\0\0\0", [(b"grpc-status", b"0")]):
        assert pod_devices(socket) == {}
