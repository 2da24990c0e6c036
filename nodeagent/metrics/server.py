"""The HTTP endpoint: /metrics, /healthz, /readyz.

One thread accepts connections and keeps the idle ones in a selector, so a connection that sends
nothing costs a file descriptor, not a thread. A connection with bytes to read gets a handler
thread, at most `max_connections` at once (beyond that it is answered 503 at once, without a
thread), which reads one request under a deadline, answers, and gives the connection back to the
selector to wait for the next keep-alive request. Handler threads are kept for the next readable
connection (starting one costs 0.2-0.5 ms, more than answering a scrape) and end after
`WORKER_IDLE_SECONDS` without work. A connection idle for `idle_timeout_seconds`,
or whose request line and headers take longer than that to arrive (slowloris), is closed.

The selector thread reads each connection's request head into a buffer as its bytes arrive
(quick.py): a client that sends half a request and stalls (slowloris) holds a buffer and a file
descriptor until the head deadline, never a handler thread. A whole head that is one plain
`GET|HEAD /metrics|/healthz|/readyz HTTP/1.1` is answered on the selector thread itself: no
thread hand-off (on an idle VM each thread wake-up costs ~0.3 ms, and a hand-off took three),
and liveness never waits for a handler thread, however many are busy. What the socket does not
take at once is finished by a handler thread, so a client that stops reading never holds the
selector. Everything else (errors, pipelining, HTTP/1.0, bodies) takes the handler path, which
gets the head read so far.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST

from nodeagent.base.errors import ConfigError
from nodeagent.base.logs import get_logger
from nodeagent.metrics.quick import (
    Check,
    Endpoints,
    head_complete,
    quick_answer,
    redacted,
)
from nodeagent.metrics.webconfig import WebConfig
from nodeagent.settings import parse_address

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = get_logger("nodeagent.metrics")
# dcgm-exporter uses 9400; nodeagent takes the next port so both can run on one node.
IDLE_TIMEOUT_SECONDS = 5.0  # between keep-alive requests, and for one request line + headers
MAX_CONNECTIONS = 64  # handler threads at once
MAX_IDLE_CONNECTIONS = 512  # waiting in the selector; beyond this the oldest is closed
LISTEN_BACKLOG = 128  # the socketserver default of 5 stalls 16 parallel scrapers
WRITE_TIMEOUT_SECONDS = 30.0  # one response to a client that stopped reading
LINGER_SECONDS = 1.0  # draining a refused request before closing, see _drain
LINGER_BYTES = 1 << 20
ACCEPT_PAUSE_SECONDS = 0.1  # after accept() fails (EMFILE), or the loop would spin
WORKER_IDLE_SECONDS = 60.0  # a handler thread without a connection to serve ends
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n"
)
READ_BYTES = 8192  # a scrape's request line and headers are a few hundred bytes
# A connection, its address, a response's unsent rest, the request head read so far.
Work = tuple[socket.socket, Any, bytes, bytes]


class MetricsServer:
    """Serves the registry and the health checks from a thread; `port` is the bound port."""

    def __init__(
        self,
        address: str,
        exposition: Callable[[], bytes],
        healthy: Check,
        ready: Check,
        *,
        idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        web: WebConfig | None = None,
        details: bool = False,
    ) -> None:
        """Binds `address` now (see parse_address). Raises ConfigError, naming the address, when
        it is malformed, does not resolve, or cannot be bound (e.g. the port is in use).

        `web`: TLS and basic auth (webconfig.py). `details`: the health checks' texts as they
        are; without it their paths and pids are taken out."""
        self.address = address
        if not details:
            healthy, ready = redacted(healthy), redacted(ready)
        endpoints = Endpoints(exposition, healthy, ready, web.auth if web else None)
        tls = web.tls if web else None
        self.httpd = _listen(address, endpoints, tls, idle_timeout_seconds, max_connections)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve, name="metrics-http", daemon=True)

    @property
    def active_connections(self) -> int:
        """Connections being served by a handler thread now (at most max_connections)."""
        return self.httpd.active_connections

    def start(self) -> None:
        self._thread.start()
        log.info("metrics.listening", address=self.address, port=self.port)

    def stop(self) -> None:
        """Stop accepting, close the idle connections and the listening socket. Requests being
        answered finish on their own (daemon threads)."""
        self.httpd.close()
        if self._thread.ident is not None:
            self._thread.join()
        self.httpd.server_close()


def _listen(
    address: str,
    endpoints: Endpoints,
    tls: ssl.SSLContext | None,
    idle_timeout_seconds: float,
    max_connections: int,
) -> _Server:
    """A bound, listening _Server on the first of `address`'s resolved addresses that binds."""
    host, port = parse_address(address)
    try:
        candidates = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as err:  # ValueError: the idna codec refuses the name
        reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
        raise ConfigError(
            f"cannot listen on {address}: cannot resolve {host!r} ({reason})"
        ) from err
    first: OSError | None = None
    for family, _type, _proto, _name, sockaddr in candidates:
        try:
            return _Server(family, sockaddr, endpoints, tls, idle_timeout_seconds, max_connections)
        except OSError as err:
            first = first or err
            # Only an address this host cannot have moves on to the next one: a port in use
            # on 127.0.0.1 must not quietly become a listener on ::1 alone.
            if err.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                break
    reason = (first.strerror or str(first)) if first else "no address to bind"
    raise ConfigError(f"cannot listen on {address}: {reason}") from first


class _Server(HTTPServer):
    """The listening socket, the selector of idle connections and the handler-thread cap."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        family: socket.AddressFamily,
        sockaddr: Any,
        endpoints: Endpoints,
        tls: ssl.SSLContext | None,
        idle_timeout_seconds: float,
        max_connections: int,
    ) -> None:
        self.address_family = family
        self.endpoints = endpoints
        self.tls = tls
        self._handshaking: set[socket.socket] = set()  # TLS connections before the handshake
        self.idle_timeout_seconds = idle_timeout_seconds
        self.active_connections = 0
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()  # guards the counts below, _stopping, _returned
        self.max_connections = max_connections
        self._work: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._workers = 0  # handler threads alive
        self._waiting = 0  # of them, waiting on _work
        self._pending = 0  # connections put on _work and not yet taken
        self._stopping = False
        self._returned: list[tuple[socket.socket, Any]] = []  # back from keep-alive handlers
        self._idle: dict[socket.socket, float] = {}  # -> deadline; insertion is deadline order
        self._heads: dict[socket.socket, bytes] = {}  # request heads being read, not yet whole
        self._accept_paused_until = 0.0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        super().__init__(sockaddr, _Handler)  # binds and listens; on failure calls server_close
        self.socket.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also calls getfqdn(host): a reverse DNS lookup nothing uses.
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            with contextlib.suppress(OSError, AttributeError):  # dual-stack where the OS allows
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super(HTTPServer, self).server_bind()
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def serve(self) -> None:
        """Accept, wait on idle connections, hand readable ones to threads; until close()."""
        try:
            while not self._stopping:
                for key, _events in self._selector.select(self._wait_seconds()):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._take_returned()
                    else:
                        self._dispatch(*key.data)
                self._expire()
        finally:
            for sock in list(self._idle):
                self._drop(sock)

    def close(self) -> None:
        """Make serve() return; connections handed back after this are closed."""
        with self._lock:
            self._stopping = True
            returned, self._returned = self._returned, []
            waiting = self._waiting
        for _ in range(waiting):
            self._work.put(None)  # idle handler threads end
        for sock, _addr in returned:
            self.shutdown_request(sock)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def server_close(self) -> None:
        super().server_close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # the client went away or stopped reading
            log.debug("http.connection_lost", client=str(client_address), error=str(err))
        else:
            log.warning("http.handler_failed", error=f"{type(err).__name__}: {err}")

    # -- the selector thread ----------------------------------------------------------------

    def _wait_seconds(self) -> float | None:
        deadlines = [next(iter(self._idle.values()))] if self._idle else []
        if self._accept_paused_until:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as err:  # EMFILE and kin: the socket stays readable, so pause
                log.warning("http.accept_failed", error=err.strerror or str(err))
                self._selector.unregister(self.socket)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_SECONDS
                return
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                sock.setblocking(False)  # the handshake runs here, as bytes arrive
                self._handshaking.add(sock)
            self._park(sock, addr)

    def _park(self, sock: socket.socket, addr: Any) -> None:
        if len(self._idle) >= MAX_IDLE_CONNECTIONS:
            self._drop(next(iter(self._idle)))
        self._idle[sock] = time.monotonic() + self.idle_timeout_seconds
        self._selector.register(sock, selectors.EVENT_READ, (sock, addr))

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._idle[sock]
        self._heads.pop(sock, None)
        self._handshaking.discard(sock)
        self.shutdown_request(sock)

    def _take_returned(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            returned, self._returned = self._returned, []
        for sock, addr in returned:
            self._park(sock, addr)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._idle and next(iter(self._idle.values())) <= now:
            self._drop(next(iter(self._idle)))
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._selector.register(self.socket, selectors.EVENT_READ)

    def _dispatch(self, sock: socket.socket, addr: Any) -> None:
        """Read what arrived; once the head is whole, answer it here or hand it over."""
        if sock in self._handshaking and not self._handshake(sock):
            return
        head = self._read_head(sock)
        if head is None:  # not whole yet: it waits here, under the deadline it had
            return
        self._selector.unregister(sock)
        del self._idle[sock]
        if not head:  # the client went away without a request
            self.shutdown_request(sock)
            return
        state, rest = self._answer_quick(sock, head)
        if state == "answered":  # wait for the next request here
            self._park(sock, addr)
        elif state == "gone":
            self.shutdown_request(sock)
        else:  # "handler": no quick request; "rest": what the socket did not take at once
            self._hand_over((sock, addr, rest, b"" if rest else head))

    def _handshake(self, sock: socket.socket) -> bool:
        """Go on with a TLS handshake; True once it is done. A failed one closes the
        connection (a client of plain HTTP, a certificate refused)."""
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        except OSError as err:
            log.debug("http.tls_failed", error=str(err))
            self._drop(sock)
            return False
        self._handshaking.discard(sock)
        return True

    def _read_head(self, sock: socket.socket) -> bytes | None:
        """The request head read so far once it is whole (or the client stopped sending:
        EOF, reset), else None."""
        try:
            if isinstance(sock, ssl.SSLSocket):  # no flags there; back from a handler thread
                sock.setblocking(False)
                chunk = sock.recv(READ_BYTES)
            else:
                chunk = sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError:  # reset by the peer
            chunk = b""
        head = self._heads.pop(sock, b"") + chunk
        if chunk and not head_complete(head):
            self._heads[sock] = head
            return None
        return head

    def _answer_quick(self, sock: socket.socket, head: bytes) -> tuple[str, bytes]:
        """Answer a quick request on this thread (see the module's doc), never blocking.
        Returns ("answered", b""), ("rest", the answer's unsent rest), ("handler", b"") when
        this is no quick request, or ("gone", b"") when the client went away."""
        if self.tls is not None:  # TLS writes can block halfway: a handler thread sends
            return "handler", b""
        quick = quick_answer(head, _SERVER_VERSION, self.endpoints)
        if quick is None:
            return "handler", b""
        answer, keep_alive = quick
        try:
            sent = sock.send(answer, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError as err:  # reset by the peer
            log.debug("http.connection_lost", error=err.strerror or str(err))
            return "gone", b""
        if sent < len(answer):
            return "rest", answer[sent:]
        return ("answered", b"") if keep_alive else ("gone", b"")

    def _hand_over(self, work: Work) -> None:
        """A handler thread takes the connection: reads and answers its request, or finishes
        sending an answer's rest; at most max_connections at once, beyond that 503."""
        sock = work[0]
        if not self._slots.acquire(blocking=False):
            log.debug("http.busy", client=str(work[1]))
            _refuse(sock)
            return
        with self._lock:
            self.active_connections += 1
            # A new thread only when every waiting one already has a connection queued.
            spawn = self._waiting <= self._pending and self._workers < self.max_connections
            if spawn:
                self._workers += 1
            else:
                self._pending += 1
                self._work.put(work)
        if not spawn:
            return
        name = f"metrics-http-{self.server_port}-conn"
        thread = threading.Thread(target=self._worker, args=(work,), name=name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # can't start new thread
            with self._lock:
                self._workers -= 1
            self._release()
            _refuse(sock)

    # -- a handler thread --------------------------------------------------------------------

    def _worker(self, work: Work | None) -> None:
        while work is not None:
            self._serve(*work)
            work = self._next_work()

    def _next_work(self) -> Work | None:
        """The next connection to serve, or None: the thread ends (stopping, or idle)."""
        with self._lock:
            if self._stopping:
                self._workers -= 1
                return None
            self._waiting += 1
        while True:
            try:
                work = self._work.get(timeout=WORKER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._pending < self._waiting:  # the others waiting take what is queued
                        self._waiting -= 1
                        self._workers -= 1
                        return None
                continue
            with self._lock:
                self._waiting -= 1
                if work is None:
                    self._workers -= 1
                else:
                    self._pending -= 1
            return work

    def _serve(self, sock: socket.socket, addr: Any, rest: bytes, head: bytes) -> None:
        keep_alive = linger = False
        try:
            if rest:  # a quick answer the socket did not take at once
                sock.settimeout(WRITE_TIMEOUT_SECONDS)
                sock.sendall(rest)
                keep_alive = True
            else:
                handler = _Handler(sock, addr, self, head)
                keep_alive, linger = handler.keep_alive, handler.linger
        except Exception:  # logged without a traceback; the thread must end quietly
            self.handle_error(sock, addr)
        try:
            if linger:
                _drain(sock)
            if not keep_alive:
                self.shutdown_request(sock)
        finally:
            self._release()  # before the give-back: its next request may want this slot
        if keep_alive and not self._give_back(sock, addr):
            self.shutdown_request(sock)

    def _give_back(self, sock: socket.socket, addr: Any) -> bool:
        with self._lock:
            if self._stopping:
                return False
            self._returned.append((sock, addr))
        with contextlib.suppress(OSError):  # a full wake pipe already wakes the selector
            self._wake_w.send(b"\0")
        return True

    def _release(self) -> None:
        with self._lock:
            self.active_connections -= 1
        self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    # Until a request line parses, http.server takes it for HTTP/0.9 and answers errors with a
    # bare HTML body, no status line: garbage would get no 400 a client can read.
    default_request_version = "HTTP/1.0"
    disable_nagle_algorithm = True  # headers and body leave at once, no delayed ACK
    timeout = WRITE_TIMEOUT_SECONDS  # for writes; reads have the request's deadline
    server: _Server
    keep_alive = False  # give the connection back to the selector for the next request
    linger = False  # answered before the whole request was read: drain it before closing

    def __init__(self, sock: socket.socket, addr: Any, server: _Server, head: bytes = b"") -> None:
        self._first = head  # what the selector thread read of the request so far
        super().__init__(sock, addr, server)  # handles the request

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader: replaced by one with a deadline
        self._reader = _HeadReader(self.connection, WRITE_TIMEOUT_SECONDS, self._first)
        self._head = io.BufferedReader(self._reader)
        self.rfile = self._head

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if not self._reader.peek_nowait(self._head):  # no pipelined request waiting
                self.keep_alive = True
                return
            self.handle_one_request()

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.idle_timeout_seconds
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.command in ("GET", "HEAD"):
            return True
        body = b"method not allowed: use GET or HEAD\n"
        self._send(405, body, "text/plain", ("Allow", "GET, HEAD"), ("Connection", "close"))
        self.linger = True
        return False

    def handle_expect_100(self) -> bool:
        return True  # no request body is ever read: don't invite one

    def do_GET(self) -> None:
        self._extra: tuple[tuple[str, str], ...] = ()
        self._send(*self._route(), *self._extra)

    def do_HEAD(self) -> None:
        self._extra = ()
        self._send(*self._route(), *self._extra)  # _send leaves the body out

    def _route(self) -> tuple[int, bytes, str]:
        path = self.path.split("?", 1)[0]
        endpoints = self.server.endpoints
        if path == "/metrics":
            if endpoints.auth is not None and not endpoints.auth.check(
                self.headers.get("Authorization")
            ):
                self._extra = (("WWW-Authenticate", 'Basic realm="nodeagent"'),)
                return 401, b"unauthorized: /metrics needs basic auth\n", "text/plain"
            return 200, endpoints.exposition(), CONTENT_TYPE_LATEST
        if path in ("/healthz", "/readyz"):
            ok, text = (endpoints.healthy if path == "/healthz" else endpoints.ready)()
            return 200 if ok else 503, (text + "\n").encode(), "text/plain"
        return 404, b"not found: try /metrics, /healthz, /readyz\n", "text/plain"

    def _send(self, code: int, body: bytes, ctype: str, *headers: tuple[str, str]) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.linger = True  # the rest of the refused request may still be arriving
        # The reason phrase may quote a 64 KiB request line; a status line needs none of it.
        super().send_error(code, message[:80] if message else None, explain)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http.request", client=str(self.client_address[0]), line=format % args)


# As the handler path's send_response writes it (BaseHTTP/0.6 Python/3.x.y).
_SERVER_VERSION = f"{_Handler.server_version} {_Handler.sys_version}".encode()


class _HeadReader(io.RawIOBase):
    """Reads a socket under one deadline for a whole request line and headers, so a client
    sending a byte at a time cannot hold a thread longer than that; writes keep their timeout."""

    def __init__(self, sock: socket.socket, write_timeout_seconds: float, head: bytes) -> None:
        super().__init__()
        self.sock = sock
        self.write_timeout_seconds = write_timeout_seconds
        self.head = head  # read by the selector thread: served first
        self.deadline = math.inf
        self.nowait = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int | None:
        if self.head:
            view = memoryview(buffer).cast("B")
            n = min(len(view), len(self.head))
            view[:n], self.head = self.head[:n], self.head[n:]
            return n
        timeout = 0.0 if self.nowait else self.deadline - time.monotonic()
        if timeout <= 0 and not self.nowait:
            raise TimeoutError("the request line and headers took too long")
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv_into(buffer)
        except (BlockingIOError, ssl.SSLWantReadError):
            return None  # nowait, nothing arrived: BufferedReader.peek returns b""
        finally:
            self.sock.settimeout(self.write_timeout_seconds)

    def peek_nowait(self, rfile: io.BufferedReader[_HeadReader]) -> bytes:
        """What `rfile` holds or the socket has received, without waiting (b"" for none)."""
        self.nowait = True
        try:
            return rfile.peek(1)
        finally:
            self.nowait = False


def _drain(sock: socket.socket) -> None:
    """Read and drop what the client still sends, for a moment: closing a socket with unread
    data sends a reset, which can destroy the error response before the client reads it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + LINGER_SECONDS
        received = 0
        while received < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return
            received += len(chunk)


def _refuse(sock: socket.socket) -> None:
    """Answer 503 without a thread (all are busy) and close."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.recv(65536)  # the request that made it readable; unread, closing would reset
        sock.send(_BUSY)
        sock.shutdown(socket.SHUT_WR)
    sock.close()
