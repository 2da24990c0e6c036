"""One unary gRPC call over a unix socket, on h2 (pure-Python HTTP/2), without grpcio.

The agent asks the kubelet one question every refresh (pod-resources List); grpcio's C core
costs it 14 MiB of RSS for that (10 on import, 4 once a channel ran), h2 about 1. What gRPC
adds to HTTP/2 for a unary call is small and done here (the gRPC over HTTP/2 spec,
PROTOCOL-HTTP2.md): a POST to /<service>/<method> with `content-type: application/grpc` and
`te: trailers`, each message behind a 5-byte prefix (a compressed flag, a big-endian length),
the outcome in the `grpc-status`/`grpc-message` trailers (or in the headers of a trailers-only
answer), the deadline sent as `grpc-timeout`.

Every failure is a CallError naming a gRPC status code as grpcio would (UNAVAILABLE: no
server, DEADLINE_EXCEEDED: no answer in time, RESOURCE_EXHAUSTED: an answer over the cap,
INTERNAL: an answer that is not gRPC).
"""

from __future__ import annotations

import socket as sockets
import struct
import time
from pathlib import Path
from urllib.parse import unquote

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
)
from h2.exceptions import H2Error

# grpcio's default max receive message size
MAX_ANSWER_BYTES = 4 * 1024 * 1024
READ_BYTES = 65536

# grpc-status values (the gRPC status codes), by number
STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# an HTTP status other than 200, as gRPC maps it (http-grpc-status-mapping.md)
HTTP_STATUS_CODES = {
    400: "INTERNAL",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "UNIMPLEMENTED",
    429: "UNAVAILABLE",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "UNAVAILABLE",
}


class CallError(Exception):
    """The call failed. `code` is the gRPC status code's name, `details` says why."""

    def __init__(self, code: str, details: str) -> None:
        self.code = code
        self.details = details
        super().__init__(f"{code} {details}")


class _Answer:
    """What came back on the call's stream so far."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.ended = False

    def add_headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers.update((name, value) for name, value in headers)

    def add_data(self, data: bytes) -> None:
        if len(self.body) + len(data) > self.max_bytes + 5:
            raise CallError("RESOURCE_EXHAUSTED", f"the answer is over {self.max_bytes} bytes")
        self.body += data

    def message(self) -> bytes:
        """The one message of a unary answer, or CallError for the status it carries."""
        http_status = self.headers.get(b":status", b"")
        if http_status != b"200":
            number = int(http_status) if http_status.isdigit() else 0
            code = HTTP_STATUS_CODES.get(number, "UNKNOWN")
            raise CallError(code, f"HTTP status {http_status.decode(errors='replace')}")
        status = self.headers.get(b"grpc-status")
        if status is None:
            raise CallError("INTERNAL", "the answer has no grpc-status")
        if status != b"0":
            number = int(status) if status.isdigit() else 2
            name = STATUS_NAMES[number] if number < len(STATUS_NAMES) else "UNKNOWN"
            message = self.headers.get(b"grpc-message", b"").decode(errors="replace")
            raise CallError(name, unquote(message))
        if len(self.body) < 5:
            raise CallError("INTERNAL", f"the answer has {len(self.body)} bytes, no message")
        compressed, length = struct.unpack_from(">BI", self.body)
        if compressed:
            raise CallError("INTERNAL", "the answer is compressed, which was not asked for")
        if length > self.max_bytes:
            raise CallError("RESOURCE_EXHAUSTED", f"the answer is over {self.max_bytes} bytes")
        if length != len(self.body) - 5:
            raise CallError(
                "INTERNAL", f"the answer's message says {length} bytes, {len(self.body) - 5} came"
            )
        return bytes(self.body[5:])


def unary_call(
    socket_path: Path,
    method: str,
    request: bytes,
    timeout_seconds: float,
    max_answer_bytes: int = MAX_ANSWER_BYTES,
) -> bytes:
    """Call `method` ('/package.Service/Method') with the encoded `request` message on the gRPC
    server listening on the unix socket `socket_path`; return the answer's encoded message.

    Raises CallError: the server refused (its grpc-status), could not be reached, did not answer
    within `timeout_seconds`, answered more than `max_answer_bytes`, or not in gRPC.
    """
    deadline = time.monotonic() + timeout_seconds
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as sock:
        sock.settimeout(timeout_seconds)
        try:
            sock.connect(str(socket_path))
        except OSError as err:
            raise CallError("UNAVAILABLE", f"cannot connect: {err.strerror or err}") from err
        try:
            return _exchange(sock, method, request, deadline, max_answer_bytes)
        except TimeoutError as err:
            raise CallError("DEADLINE_EXCEEDED", f"no answer within {timeout_seconds:g} s") from err
        except H2Error as err:
            raise CallError("INTERNAL", f"the answer is not HTTP/2 ({err})") from err
        except OSError as err:
            raise CallError("UNAVAILABLE", f"connection lost: {err.strerror or err}") from err


def _check_preface(start: bytes) -> bytes | None:
    """None once `start` is known to begin as a server's HTTP/2 preface does: with a SETTINGS
    frame (RFC 9113 3.4; type 4 in its 9-byte header), else the bytes to check with more.
    h2 would wait for the whole of the frame a garbage header announces (megabytes).

    Raises CallError when it begins otherwise (an HTTP/1 server, not gRPC at all)."""
    if len(start) < 9:
        return start
    if start[3] != 4:
        raise CallError("INTERNAL", f"the answer is not HTTP/2 (it begins {start[:9]!r})")
    return None


def _exchange(
    sock: sockets.socket, method: str, request: bytes, deadline: float, max_answer_bytes: int
) -> bytes:
    conn = H2Connection(config=H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    timeout_ms = max(1, int((deadline - time.monotonic()) * 1000))
    conn.send_headers(
        stream,
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method.encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", f"{min(timeout_ms, 99_999_999)}m".encode()),
        ],
    )
    conn.send_data(stream, struct.pack(">BI", 0, len(request)) + request, end_stream=True)
    answer = _Answer(max_answer_bytes)
    start: bytes | None = b""  # the answer's first bytes, until they are known to be HTTP/2
    while not answer.ended:
        if outgoing := conn.data_to_send():
            sock.sendall(outgoing)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(READ_BYTES)
        if not chunk:
            raise CallError("UNAVAILABLE", "the server closed the connection before answering")
        if start is not None:
            start = _check_preface(start + chunk)
        for event in conn.receive_data(chunk):
            if isinstance(event, (ResponseReceived, TrailersReceived)):
                answer.add_headers(event.headers)
            elif isinstance(event, DataReceived) and event.stream_id == stream:
                answer.add_data(event.data)
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
            elif isinstance(event, StreamEnded) and event.stream_id == stream:
                answer.ended = True
            elif isinstance(event, StreamReset) and event.stream_id == stream:
                reason = getattr(event.error_code, "name", event.error_code)
                raise CallError("UNAVAILABLE", f"the server reset the call ({reason})")
            elif isinstance(event, ConnectionTerminated) and not answer.ended:
                reason = getattr(event.error_code, "name", event.error_code)
                raise CallError("UNAVAILABLE", f"the server ended the connection ({reason})")
    return answer.message()
