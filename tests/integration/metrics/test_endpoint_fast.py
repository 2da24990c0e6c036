"""Big answers and probes: a scrape is answered the same way whatever its headers, keep-alive
kept; a client that stops reading a big answer holds no other scrape; a probe with
`Connection: close` gets the answer an HTTP/1.0 request gets."""

from __future__ import annotations

import socket
import threading

import pytest

from nodeagent.metrics.server import MetricsServer
from tests.integration.metrics.test_endpoint_hostile import (
    TIMEOUT,
    connection_threads,
    exchange,
    exposing,
    scrape,
)

BIG = b"# TYPE filler gauge\n" + b"".join(b'filler{i="%d"} 1.0\n' % i for i in range(400_000))


def read_answer(sock: socket.socket) -> tuple[list[bytes], bytes]:
    """One HTTP answer from a keep-alive connection: its header lines and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before the headers"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    (length,) = [int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")]
    while len(body) < length:
        chunk = sock.recv(1 << 20)
        assert chunk, "closed before the whole body"
        body += chunk
    return lines, body


@pytest.fixture
def server() -> MetricsServer:
    srv = MetricsServer("127.0.0.1:0", exposing(BIG), lambda: (True, "ok"), lambda: (True, "ok"))
    srv.start()
    yield srv  # type: ignore[misc]
    srv.stop()


def without_date(lines: list[bytes]) -> list[bytes]:
    return [x for x in lines if not x.lower().startswith(b"date: ")]


def test_a_scrape_is_answered_alike_whatever_its_headers(server: MetricsServer) -> None:
    plain = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
    handled = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(plain)
        fast_lines, fast_body = read_answer(sock)
        sock.sendall(handled)
        slow_lines, slow_body = read_answer(sock)
        sock.sendall(plain)  # the same connection again: it was kept alive both times
        again_lines, again_body = read_answer(sock)
    assert fast_body == slow_body == again_body == BIG
    assert without_date(fast_lines) == without_date(slow_lines) == without_date(again_lines)
    assert fast_lines[0] == b"HTTP/1.1 200 OK"
    assert any(x.lower().startswith(b"date: ") and x.endswith(b" GMT") for x in fast_lines)


def test_a_client_that_stops_reading_holds_no_other_scrape(server: MetricsServer) -> None:
    assert len(BIG) > 8 << 20  # more than the socket buffers take at once
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small
    stalled.settimeout(TIMEOUT)  # window from the start (shrunk later, loopback can stall)
    stalled.connect(("127.0.0.1", server.port))
    try:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        # The rest of its answer waits in the loop's write buffer; the loop serves the others.
        assert stalled.recv(12, socket.MSG_PEEK) == b"HTTP/1.1 200"
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(scrape("127.0.0.1", server.port)))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 4)
        assert results == [(200, BIG)] * 4
        _lines, body = read_answer(stalled)  # and the stalled client still gets it whole
        assert body == BIG
    finally:
        stalled.close()


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_probe_is_answered_as_an_http_1_0_request_is(path: str, method: str) -> None:
    """kubelet's probe (HTTP/1.1, Connection: close) gets the answer an HTTP/1.0 request gets
    and is closed; a 503 stays a 503. No thread is started for it."""
    srv = MetricsServer(
        "127.0.0.1:0", exposing(BIG), lambda: (True, "ok"), lambda: (False, "first reconcile")
    )
    srv.start()
    try:
        probe = f"{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.31\r\n"
        quick = exchange("127.0.0.1", srv.port, (probe + "Connection: close\r\n\r\n").encode())
        threads = connection_threads(srv.port)
        handled = exchange("127.0.0.1", srv.port, f"{method} {path} HTTP/1.0\r\n\r\n".encode())
    finally:
        srv.stop()
    assert threads == 0
    quick_head, _, quick_body = quick.partition(b"\r\n\r\n")
    handled_head, _, handled_body = handled.partition(b"\r\n\r\n")
    assert quick_body == handled_body == (b"" if method == "HEAD" else
                                          b"ok\n" if path == "/healthz" else b"first reconcile\n")  # fmt: skip
    lines = without_date(quick_head.split(b"\r\n"))
    assert lines[-1].lower() == b"connection: close"
    assert lines == without_date(handled_head.split(b"\r\n"))


def test_answers_go_out_as_written_without_nagle(server: MetricsServer) -> None:
    """Every connection has TCP_NODELAY: with Nagle's algorithm a body smaller than a segment
    waited for the client's delayed ACK of the answer's head (40 ms a scrape on Linux). The
    listening socket is made with proto 0, for which asyncio does not set it itself."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        read_answer(sock)
        connections = list(server.connections())
        assert connections, "the server holds the open connection"
        for peer in connections:
            assert peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
