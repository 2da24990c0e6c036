"""The metrics endpoint under hostile input: bad addresses, odd methods, garbage, floods of
scrapers and of idle or slow connections. Every case ends with the server still answering."""

from __future__ import annotations

import contextlib
import http.client
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import CollectorRegistry

from nodeagent.base.errors import ConfigError
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.server import RENDER_THREADS, MetricsServer
from tests.support.cli import Result, assert_one_error, captured_logs
from tests.support.metrics import wait_for

EXPOSITION = b"# HELP up Whether up.\n# TYPE up gauge\nup 1.0\n"
TIMEOUT = 5.0  # a bound on waits that normally end in milliseconds; never a timing assert
IDLE = 0.5  # the idle timeout injected into servers that test it
Cli = Callable[..., Result]
if TYPE_CHECKING:
    from nodeagent.metrics.exposition import Format


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


IPV6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this host")


def exposing(body: bytes) -> Callable[[Format], bytes]:
    """An exposition of `body` (text-format families) in every format, as the agent's."""
    return ExpositionCache(CollectorRegistry(), lambda: body).latest


def make_server(address: str = "127.0.0.1:0", **options: float) -> MetricsServer:
    server = MetricsServer(
        address,
        exposing(EXPOSITION),
        lambda: (True, "ok"),
        lambda: (False, "first reconcile not done"),
        **options,  # type: ignore[arg-type]
    )
    server.start()
    return server


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[str, int]]]:
    """Start a server (address, options); returns the host and port to connect to."""
    started: list[MetricsServer] = []

    def start(address: str = "127.0.0.1:0", **options: float) -> tuple[str, int]:
        server = make_server(address, **options)
        started.append(server)
        return server.host, server.port

    yield start
    for server in started:
        server.stop()


@pytest.fixture(params=["127.0.0.1:0", pytest.param("[::1]:0", marks=IPV6)])
def endpoint(
    request: pytest.FixtureRequest, serve: Callable[..., tuple[str, int]]
) -> Iterator[tuple[str, int]]:
    """A server on IPv4 and on IPv6 loopback, proven still healthy after the test."""
    host, port = serve(request.param)
    yield host, port
    assert scrape(host, port) == (200, EXPOSITION)


@pytest.fixture(autouse=True)
def quiet_logs(capfd: pytest.CaptureFixture[str]) -> Iterator[list[dict[str, object]]]:
    """Every test: no traceback on stderr and no warning or error logged, whatever was sent."""
    with captured_logs("debug") as events:
        yield events
    loud = [e for e in events if e["log_level"] not in ("debug", "info") or "exc_info" in e]
    assert not loud
    assert "Traceback" not in capfd.readouterr().err


def scrape(host: str, port: int, path: str = "/metrics") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def exchange(host: str, port: int, raw: bytes) -> bytes:
    """Send raw bytes, half-close, and read everything until the server closes."""
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close mid-send
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def wait_closed_by_server(
    socks: list[socket.socket], probe: Callable[[], None] = lambda: None
) -> list[bytes]:
    """Wait until the server has closed every socket (EOF or reset), calling `probe` on each
    turn; returns what each received. Fails after TIMEOUT."""
    received = {sock: b"" for sock in socks}
    deadline = time.monotonic() + TIMEOUT
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while sel.get_map():
            probe()
            left = deadline - time.monotonic()
            assert left > 0, f"{len(sel.get_map())} connections still open"
            for key, _ in sel.select(min(left, 0.05)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                received[sock] += chunk
                if not chunk:
                    sel.unregister(sock)
    return [received[sock] for sock in socks]


def connection_threads(port: int) -> int:
    return sum(t.name.startswith(f"metrics-http-{port}-conn") for t in threading.enumerate())


# -- addresses ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("", ["''", "HOST:PORT"]),
        ("nowhere", ["'nowhere'", "HOST:PORT"]),
        (":99999", ["':99999'", "HOST:PORT"]),
        ("1.2.3.4:-1", ["'1.2.3.4:-1'", "HOST:PORT"]),
        ("127.0.0.1:", ["'127.0.0.1:'", "HOST:PORT"]),
        ("127.0.0.1:\uff19\uff14\uff10\uff11", ["HOST:PORT"]),  # fullwidth digits
        ("[::1", ["'[::1'", "[IPV6]:PORT"]),
        ("::1:9401", ["'::1:9401'", "[IPV6]:PORT"]),
        ("[]:9401", ["'[]:9401'", "[IPV6]:PORT"]),
        ("[localhost]:9401", ["'[localhost]:9401'", "[IPV6]:PORT"]),
        ("two words:9401", ["'two words:9401'", "HOST:PORT"]),
        ("x" * 70 + ".example:9401", ["cannot listen on xxx", "cannot resolve"]),
    ],
)
def test_bad_address_is_one_config_error(address: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        MetricsServer(address, exposing(b""), lambda: (True, ""), lambda: (True, ""))
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "address", ["127.0.0.1:0", "localhost:0", pytest.param("[::1]:0", marks=IPV6)]
)
def test_port_in_use_is_a_config_error(address: str) -> None:
    first = make_server(address)
    try:
        taken = address.replace(":0", f":{first.port}")
        with pytest.raises(ConfigError, match="Address already in use") as caught:
            make_server(taken)
        assert f"cannot listen on {taken}:" in str(caught.value)
    finally:
        first.stop()


@pytest.mark.parametrize(
    ("address", "connect_to"),
    [
        ("localhost:0", None),
        pytest.param("[::]:0", "::1", marks=IPV6),
        pytest.param("[::]:0", "127.0.0.1", marks=IPV6, id="dual-stack"),
    ],
)
def test_names_and_ipv6_wildcard_serve(
    serve: Callable[..., tuple[str, int]], address: str, connect_to: str | None
) -> None:
    host, port = serve(address)
    assert scrape(connect_to or host, port) == (200, EXPOSITION)


@pytest.mark.parametrize("address", ["[::1", "127.0.0.1:99999"])
def test_cli_refuses_a_bad_address_with_exit_2(cli: Cli, address: str) -> None:
    res = cli("--simulate", "h200", "run", "--metrics-address", address)
    assert_one_error(res, 2, address)


def test_cli_refuses_a_port_in_use_with_exit_2(cli: Cli) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        res = cli("--simulate", "h200", "run", "--metrics-address", address)
    assert_one_error(res, 2, f"cannot listen on {address}", "Address already in use")


# -- methods and paths --------------------------------------------------------------------------

NOT_ALLOWED = b"method not allowed: use GET or HEAD\n"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "answer", "content_type"),
    [
        ("GET", "/metrics", None, 200, EXPOSITION, CONTENT_TYPE_LATEST),
        ("GET", "/metrics?name[]=up&debug=1", None, 200, EXPOSITION, CONTENT_TYPE_LATEST),
        ("GET", "//metrics", None, 200, EXPOSITION, CONTENT_TYPE_LATEST),
        ("GET", "/healthz", None, 200, b"ok\n", "text/plain"),
        ("GET", "/readyz?verbose", None, 503, b"first reconcile not done\n", "text/plain"),
        ("GET", "/nope", None, 404, b"not found: try /metrics, /healthz, /readyz\n", "text/plain"),
        ("HEAD", "/metrics", None, 200, EXPOSITION, CONTENT_TYPE_LATEST),
        ("HEAD", "/readyz", None, 503, b"first reconcile not done\n", "text/plain"),
        ("HEAD", "/nope", None, 404, b"not found: try /metrics, /healthz, /readyz\n", "text/plain"),
        ("POST", "/metrics", b"x" * 200_000, 405, NOT_ALLOWED, "text/plain"),
        ("PUT", "/metrics", b"up 0\n", 405, NOT_ALLOWED, "text/plain"),
        ("DELETE", "/metrics", None, 405, NOT_ALLOWED, "text/plain"),
        ("PATCH", "/healthz", None, 405, NOT_ALLOWED, "text/plain"),
        ("OPTIONS", "*", None, 405, NOT_ALLOWED, "text/plain"),
        ("TRACE", "/", None, 405, NOT_ALLOWED, "text/plain"),
        # A method the parser (llhttp) does not know is a malformed request.
        ("BREW", "/pot", None, 400, b"bad request\n", "text/plain"),
    ],
)
def test_methods_and_paths(
    endpoint: tuple[str, int],
    method: str,
    path: str,
    body: bytes | None,
    status: int,
    answer: bytes,
    content_type: str,
) -> None:
    conn = http.client.HTTPConnection(*endpoint, timeout=TIMEOUT)
    try:
        conn.request(method, path, body)
        resp = conn.getresponse()
        got = resp.read()
    finally:
        conn.close()
    assert resp.status == status
    assert resp.getheader("Content-Type") == content_type
    assert resp.getheader("Content-Length") == str(len(answer))  # HEAD: what GET would send
    assert got == (b"" if method == "HEAD" else answer)
    if status == 405:
        assert resp.getheader("Allow") == "GET, HEAD"
        assert resp.will_close


def test_refused_method_is_logged_quietly(
    endpoint: tuple[str, int], quiet_logs: list[dict[str, object]]
) -> None:
    conn = http.client.HTTPConnection(*endpoint, timeout=TIMEOUT)
    conn.request("POST", "/metrics", b"up 0\n")
    assert conn.getresponse().status == 405
    conn.close()
    lines = [str(e.get("line")) for e in quiet_logs if e["event"] == "http.request"]
    assert any('"POST /metrics HTTP/1.1" 405' in line for line in lines), lines


def test_keep_alive_serves_get_head_get_on_one_connection(endpoint: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*endpoint, timeout=TIMEOUT)
    try:
        sockets = set()
        for method in ("GET", "HEAD", "GET", "GET"):
            conn.request(method, "/metrics")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"" if method == "HEAD" else EXPOSITION)
            assert not resp.will_close
            sockets.add(id(conn.sock))
        assert len(sockets) == 1
    finally:
        conn.close()


def test_pipelined_requests_are_all_answered(endpoint: tuple[str, int]) -> None:
    one = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(*endpoint, one * 3 + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 4
    assert answer.count(EXPOSITION) == 3
    assert answer.endswith(b"ok\n")


def statuses(response: bytes) -> list[int]:
    """The status of every answer in a stream of pipelined answers, in order."""
    return [int(m) for m in re.findall(rb"^HTTP/1\.1 (\d{3}) ", response, re.MULTILINE)]


def test_1000_pipelined_requests_in_one_send_are_all_answered_in_order(
    endpoint: tuple[str, int],
) -> None:
    """As Prometheus' own exporters (Go's net/http) answer them; each request has its own
    head limits (one Host header each is not 1,000 headers)."""
    paths = [("/metrics", 200), ("/healthz", 200), ("/readyz", 503), ("/nope", 404)] * 250
    raw = b"".join(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % p.encode() for p, _ in paths)
    got = statuses(exchange(*endpoint, raw))
    assert len(got) == len(paths)  # a short failure message (a 1,000-item diff is not)
    assert got == [status for _, status in paths]


def test_pipelined_requests_near_the_header_limits_are_each_answered(
    endpoint: tuple[str, int],
) -> None:
    one = (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 99 + b"X-Pad: " + b"p" * 60_000
           + b"\r\n\r\n")  # fmt: skip
    assert statuses(exchange(*endpoint, one * 20)) == [200] * 20


@pytest.mark.parametrize(
    ("bad", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"y" * 70_000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"hello\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nup 0\n", 405),
        (b"GET /metr", 400),  # then the client's EOF: incomplete
    ],
    ids=["70KB-header", "200-headers", "long-line", "garbage", "http2", "post", "incomplete"],
)
def test_a_refusal_comes_after_the_answers_pipelined_before_it(
    endpoint: tuple[str, int], bad: bytes, status: int
) -> None:
    good = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = exchange(*endpoint, good * 3 + bad + good)
    assert statuses(answer) == [200, 200, 200, status]  # nothing after the refusal
    assert answer.count(EXPOSITION) == 3


def test_an_upgrade_request_is_answered_and_what_follows_it_too(
    endpoint: tuple[str, int],
) -> None:
    upgrade = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
               b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")  # fmt: skip
    answer = exchange(*endpoint, upgrade + b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(answer) == [200, 200]
    assert answer.endswith(EXPOSITION)


STALLED = {
    "post": b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
    "put": b"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
    "chunked": b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    "expect": b"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
    b"Expect: 100-continue\r\n\r\n",
    "half-body": b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nup 0\n",
}


@pytest.mark.parametrize("head", STALLED.values(), ids=STALLED.keys())
def test_a_body_that_never_comes_is_not_waited_for(
    serve: Callable[..., tuple[str, int]], head: bytes
) -> None:
    """The client sends a head and waits, its body never coming: it is answered 405 at once
    and closed within the head deadline, not held until it goes away."""
    host, port = serve(idle_timeout_seconds=60.0)  # only the answer's close may close it
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sock.sendall(head)
        (received,) = wait_closed_by_server([sock])
    assert statuses(received) == [405]
    assert b"\r\nallow: GET, HEAD\r\n" in received
    assert received.endswith(NOT_ALLOWED)


@pytest.mark.parametrize(
    "head",
    [b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
     b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"],
    ids=["length", "chunked"],
)  # fmt: skip
def test_a_get_whose_body_never_comes_is_answered_then_cut_off_at_the_deadline(
    serve: Callable[..., tuple[str, int]], head: bytes
) -> None:
    host, port = serve(idle_timeout_seconds=IDLE)
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sock.sendall(head)
        (received,) = wait_closed_by_server([sock])
    assert statuses(received) == [200]
    assert received.endswith(EXPOSITION)


# -- garbage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"hello\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\xde\xad\r\n", 400),  # TLS to plain HTTP
        (b"\x00" * 64 + b"\r\n\r\n", 400),
        (b"\xff\xfe\xfd", 400),  # then EOF: no line end ever comes
        (b"A B C D\r\n\r\n", 400),
        (b"GET /metrics HTTP/x.y\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1.1\r\n\r\n", 400),
        (b"POST /metrics\r\n\r\n", 400),  # HTTP/0.9 knows only GET
        (b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"y" * 70_000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n", 431),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
    ],
    ids=lambda v: str(v)[:24] if isinstance(v, bytes) else str(v),
)
def test_garbage_gets_an_error_status(endpoint: tuple[str, int], raw: bytes, status: int) -> None:
    answer = exchange(*endpoint, raw)
    assert status_of(answer) == status


def test_a_request_line_without_version_is_refused_not_left_open(
    endpoint: tuple[str, int],
) -> None:
    answer = exchange(*endpoint, b"GET /metrics\r\n")  # HTTP/0.9, then the client's EOF
    assert status_of(answer) == 400


# -- floods -------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "connection-per-scrape"])
def test_many_parallel_scrapers_all_succeed(endpoint: tuple[str, int], keep_alive: bool) -> None:
    def scraper(_: int) -> list[tuple[int, bytes]]:
        if not keep_alive:
            return [scrape(*endpoint) for _ in range(20)]
        conn = http.client.HTTPConnection(*endpoint, timeout=TIMEOUT)
        try:
            results = []
            for _ in range(20):
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                results.append((resp.status, resp.read()))
            return results
        finally:
            conn.close()

    with ThreadPoolExecutor(32) as pool:
        results = [r for batch in pool.map(scraper, range(32)) for r in batch]
    assert results == [(200, EXPOSITION)] * 32 * 20


def test_handler_threads_are_kept_for_the_next_connection_and_end_with_the_server() -> None:
    """30 requests of the handler path (HTTP/1.0) one after the other, each on a new
    connection, are served by a few kept threads (not one thread each); stopping the server
    ends them."""
    server = make_server()
    port = server.port
    seen: set[threading.Thread] = set()  # the objects, so that no two share an id
    try:
        for _ in range(30):
            answer = exchange("127.0.0.1", port, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert status_of(answer) == 200 and answer.endswith(EXPOSITION)
            seen.update(t for t in threading.enumerate()
                        if t.name.startswith(f"metrics-http-{port}-conn"))  # fmt: skip
        assert 1 <= len(seen) <= 5
    finally:
        server.stop()
    deadline = time.monotonic() + TIMEOUT
    while connection_threads(port) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connection_threads(port) == 0


def test_idle_connections_hold_no_thread_and_are_closed(
    serve: Callable[..., tuple[str, int]],
) -> None:
    host, port = serve(idle_timeout_seconds=IDLE, max_connections=8)
    idle = [socket.create_connection((host, port), timeout=TIMEOUT) for _ in range(100)]
    try:
        assert scrape(host, port) == (200, EXPOSITION)  # at once, not after the idle ones go
        most = [0]

        def count() -> None:
            most[0] = max(most[0], connection_threads(port))

        wait_closed_by_server(idle, count)
        assert most[0] <= 8
    finally:
        for sock in idle:
            sock.close()


def test_the_oldest_idle_connections_make_room_for_new_ones(
    serve: Callable[..., tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nodeagent.metrics.server.MAX_IDLE_CONNECTIONS", 10)
    host, port = serve(idle_timeout_seconds=60.0)  # only eviction closes anything here
    old = [socket.create_connection((host, port), timeout=TIMEOUT) for _ in range(10)]
    new = [socket.create_connection((host, port), timeout=TIMEOUT) for _ in range(10)]
    try:
        wait_closed_by_server(old)
        assert scrape(host, port) == (200, EXPOSITION)
        for sock in new[1:]:  # the scrape's connection took the place of the oldest new one
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in old + new:
            sock.close()


HALF_SENT = 200


def test_half_sent_requests_hold_no_thread_and_liveness_answers_at_once() -> None:
    """200 clients each send half a request line and stall (slowloris): none holds a handler
    thread or is refused, and /healthz and /metrics answer while all 200 are still open."""
    server = make_server(idle_timeout_seconds=60.0, max_connections=8)
    host, port = "127.0.0.1", server.port
    slow = [socket.create_connection((host, port), timeout=TIMEOUT) for _ in range(HALF_SENT)]
    try:
        for sock in slow:
            sock.sendall(b"GET /metr")
        assert scrape(host, port, "/healthz") == (200, b"ok\n")
        assert scrape(host, port) == (200, EXPOSITION)
        wait_for(lambda: server.active_connections == 0, "the scrape's end counted")
        assert connection_threads(port) <= RENDER_THREADS  # the scrape's, kept for the next
        for sock in slow:  # each still waits for the rest of its request: no answer, no close
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_half_sent_requests_are_cut_off_silently_at_the_head_deadline() -> None:
    server = make_server(idle_timeout_seconds=IDLE, max_connections=8)
    host, port = "127.0.0.1", server.port
    slow = [socket.create_connection((host, port), timeout=TIMEOUT) for _ in range(HALF_SENT)]
    try:
        for sock in slow:
            sock.sendall(b"GET /metr")
        most = [0]

        def count() -> None:
            most[0] = max(most[0], connection_threads(port), server.active_connections)

        assert wait_closed_by_server(slow, count) == [b""] * HALF_SENT
        assert most[0] == 0
        assert scrape(host, port) == (200, EXPOSITION)
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_a_head_sent_byte_by_byte_is_cut_off_at_the_deadline(
    serve: Callable[..., tuple[str, int]],
) -> None:
    host, port = serve(idle_timeout_seconds=IDLE)
    head = b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 200 + b"\r\n\r\n"
    with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
        sent = 0
        deadline = time.monotonic() + TIMEOUT
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            # One byte per 20 ms, each a wait for the server to close the connection.
            while sent < len(head) and not sel.select(0.02):
                assert time.monotonic() < deadline
                sock.sendall(head[sent : sent + 1])
                sent += 1
        assert sent < len(head), "the whole head got through: no deadline"
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(65536) == b""


def test_an_idle_keep_alive_connection_is_closed(serve: Callable[..., tuple[str, int]]) -> None:
    host, port = serve(idle_timeout_seconds=IDLE)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == EXPOSITION
        assert conn.sock is not None
        wait_closed_by_server([conn.sock])
    finally:
        conn.close()


def test_stop_closes_idle_connections() -> None:
    server = make_server()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
    conn.request("GET", "/metrics")
    assert conn.getresponse().read() == EXPOSITION
    assert conn.sock is not None
    server.stop()
    try:
        wait_closed_by_server([*idle, conn.sock])
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT).close()
    finally:
        conn.close()
        for sock in idle:
            sock.close()
