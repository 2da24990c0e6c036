"""The HTTP endpoint: /metrics, /healthz, /readyz, served by uvicorn (asyncio, httptools'
parser) on one thread of its own; endpoints.py is the application.

One event loop holds every connection: an idle or slow one costs a file descriptor and a
buffer, never a thread, and a TLS handshake runs on the loop as its bytes arrive. uvicorn
lacks what a hostile network needs, added by `_Protocol`: one deadline
(`idle_timeout_seconds`) from the connection's start or its last answer until the next
request's line and headers are whole (uvicorn times out neither a connection that never
sends, nor a head trickling in: slowloris); a cap on connections waiting for a head
(`MAX_IDLE_CONNECTIONS`; the oldest goes); limits on each request's head, as http.server's
(414, 431; httptools' parser has none); methods other than GET and HEAD answered 405 from
their head, never waiting for a body that may never come; and pipelined requests answered
in order, a refusal included, with a bound on how many wait parsed. uvicorn's periodic tick
(ten wake-ups a second, for its Date header) is not run: the application writes Date itself.

`_Protocol` subclasses uvicorn's HttpToolsProtocol and uses names that uvicorn does not
promise to keep: pyproject.toml bounds uvicorn's version and
tests/unit/metrics/test_uvicorn_contract.py checks each of those names.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import http
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.logs import get_logger
from nodeagent.metrics.endpoints import Check, Endpoints, redacted
from nodeagent.metrics.exposition import Format
from nodeagent.metrics.webconfig import WebConfig
from nodeagent.settings import parse_address

log = get_logger("nodeagent.metrics")
IDLE_TIMEOUT_SECONDS = 5.0  # between keep-alive requests, and for one request line + headers
MAX_CONNECTIONS = 64  # requests answered at once; beyond, 503 at once
MAX_IDLE_CONNECTIONS = 512  # waiting for a request head; beyond this the oldest is closed
RENDER_THREADS = 2  # renders of the exposition and first bcrypt checks; renders take a lock
LISTEN_BACKLOG = 128  # the socketserver default of 5 stalls 16 parallel scrapers
MAX_LINE_BYTES = 65536  # http.server's limits: the request target (else 414)
MAX_HEADER_BYTES = 65536  # all header names and values (else 431)
MAX_HEADERS = 100  # (else 431)
LINGER_SECONDS = 1.0  # draining a refused request before closing, see _Protocol._refuse
LINGER_BYTES = 1 << 20
MAX_PIPELINED = 128  # parsed requests waiting behind the one answered; the rest waits unparsed
FEED_BYTES = 4096  # parsed at a time, so that the wait above is bounded
START_SECONDS = 10.0
ACCEPT_LOG_SECONDS = 60.0  # a failing accept (descriptors exhausted) is logged once this often
ALLOW = ((b"allow", b"GET, HEAD"),)
Refusal = tuple[int, str, tuple[tuple[bytes, bytes], ...]]  # status, reason, extra headers


class MetricsServer:
    """Serves the registry and the health checks from a thread; `port` is the bound port."""

    def __init__(
        self,
        address: str,
        exposition: Callable[[Format], bytes],
        healthy: Check,
        ready: Check,
        *,
        idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        web: WebConfig | None = None,
        details: bool = False,
        cached: Callable[[Format], bytes | None] | None = None,
    ) -> None:
        """Binds `address` now (see parse_address). Raises ConfigError, naming the address, when
        it is malformed, does not resolve, or cannot be bound (e.g. the port is in use).

        `exposition(fmt)`: the exposition in a format (ExpositionCache.latest). `web`: TLS and
        basic auth (webconfig.py). `details`: the health checks' texts as they are; without it
        their paths and pids are taken out. `cached(fmt)`: the exposition if it is rendered
        already, else None, without waiting (ExpositionCache.fresh)."""
        self.address = address
        if not details:
            healthy, ready = redacted(healthy), redacted(ready)
        self.socket = _listen(address)
        bound = self.socket.getsockname()
        self.host, self.port = str(bound[0]), int(bound[1])
        self._executor = ThreadPoolExecutor(
            RENDER_THREADS, thread_name_prefix=f"metrics-http-{self.port}-conn"
        )
        self.endpoints = Endpoints(
            exposition, healthy, ready, executor=self._executor, max_requests=max_connections,
            cached=cached, auth=web.auth if web else None,
        )  # fmt: skip
        waiting = _Waiting(idle_timeout_seconds)
        tls = web.tls if web else None
        config = uvicorn.Config(
            self.endpoints,
            # uvicorn builds a protocol per connection from this callable, a class or not
            http=functools.partial(_Protocol, waiting=waiting),  # type: ignore[arg-type]
            lifespan="off", log_config=None, access_log=False, proxy_headers=False, ws="none",
            server_header=False, date_header=False, backlog=LISTEN_BACKLOG,
            timeout_keep_alive=int(idle_timeout_seconds) + 1,  # _Protocol's deadline is first
            ssl_context_factory=(lambda _config, _default: tls) if tls else None,
        )  # fmt: skip
        self._uvicorn = _Uvicorn(config)
        self._uvicorn.stop = asyncio.Event()  # bound to the loop that first waits for it
        self._started = threading.Event()
        self._failed: BaseException | None = None
        _route_uvicorn_logs()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    @property
    def active_connections(self) -> int:
        """Requests being answered now, their sending included (at most max_connections)."""
        return self.endpoints.active

    def connections(self) -> list[socket.socket]:
        """The sockets of the connections open now (uvicorn's server state)."""
        found = []
        for protocol in list(self._uvicorn.server_state.connections):
            transport = getattr(protocol, "transport", None)
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:
                found.append(sock)
        return found

    def start(self) -> None:
        """Serve from now on; returns once the loop accepts connections. Raises AgentError
        when it does not within START_SECONDS."""
        self._thread.start()
        started = self._started.wait(START_SECONDS)
        if not started or self._failed is not None:
            self.stop()
            err = self._failed
            reason = f"{type(err).__name__}: {err}" if err else f"no answer in {START_SECONDS:g} s"
            raise AgentError(f"the metrics endpoint on {self.address} did not start ({reason})")
        log.info("metrics.listening", address=self.address, port=self.port)

    def stop(self) -> None:
        """Stop accepting, close every connection (answers being sent are cut off) and the
        listening socket."""
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(self._uvicorn.stop.set)
            self._thread.join()
        self.socket.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_LoopErrors())
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as err:  # SystemExit included: uvicorn's way to give up
            self._failed = err
            self._started.set()
        finally:
            _finish(loop)

    async def _serve(self) -> None:
        self._uvicorn.on_started = self._started.set
        await self._uvicorn.serve(sockets=[self.socket])
        if not self._started.is_set():  # uvicorn gave up in its startup (and logged why)
            self._failed = RuntimeError("the server did not start")
            self._started.set()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, waiting for stop() instead of ticking ten times a second."""

    stop: asyncio.Event
    on_started: Callable[[], None]

    async def main_loop(self) -> None:
        self.on_started()
        await self.stop.wait()
        self.force_exit = True  # shutdown() then waits for no connection
        for connection in list(self.server_state.connections):
            connection.transport.abort()


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    """Close the loop after its last tasks (answers cut off by stop) ran to their end: a task
    destroyed pending is a warning in the log."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


class _LoopErrors:
    """The loop's exception handler. A failing accept (EMFILE and kin: asyncio retries it a
    second later) is a warning the operator must see, once per ACCEPT_LOG_SECONDS with the
    count of the repeats since (each repeat at debug); a client that went away is debug."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.logged_at: float | None = None
        self.repeated = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        err = context.get("exception")
        if isinstance(err, OSError) and "accept" in str(context.get("message")):
            self.accept_failed(err.strerror or str(err))
        elif isinstance(err, OSError):  # a client that went away, a failed TLS handshake
            log.debug("http.connection_lost", error=str(err))
        else:
            log.warning("http.loop_error", message=context.get("message"), error=repr(err))

    def accept_failed(self, error: str) -> None:
        now = self.clock()
        if self.logged_at is not None and now - self.logged_at < ACCEPT_LOG_SECONDS:
            self.repeated += 1
            log.debug("http.accept_failed", error=error, repeated=self.repeated)
            return
        log.warning("http.accept_failed", error=error, repeated=self.repeated)
        self.logged_at, self.repeated = now, 0


class _UvicornLogs(logging.Handler):
    """uvicorn's own log records (logging's "uvicorn" loggers) as one structured line each,
    an exception as its repr, never a traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        err = record.exc_info[1] if record.exc_info else None
        fields: dict[str, Any] = {"message": record.getMessage()}
        if err is not None:
            fields["error"] = repr(err)
        if isinstance(err, asyncio.CancelledError):  # an answer cut off by stop()
            log.debug("http.cancelled", **fields)
        elif record.levelno >= logging.ERROR:
            log.error("http.server_error", **fields)
        elif record.levelno >= logging.WARNING:
            log.warning("http.server_warning", **fields)
        else:
            log.debug("http.server", **fields)


def _route_uvicorn_logs() -> None:
    """Send uvicorn's log records to the agent's log (without it logging's last resort prints
    them, tracebacks included, to stderr)."""
    logger = logging.getLogger("uvicorn")
    if not any(isinstance(h, _UvicornLogs) for h in logger.handlers):
        logger.addHandler(_UvicornLogs())
    logger.propagate = False


class _Waiting:
    """The connections waiting for a request head, oldest first, and their deadline."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self.order: dict[_Protocol, None] = {}

    def add(self, connection: _Protocol) -> None:
        if len(self.order) >= MAX_IDLE_CONNECTIONS:
            oldest = next(iter(self.order))
            del self.order[oldest]
            oldest.transport.close()
        self.order[connection] = None

    def discard(self, connection: _Protocol) -> None:
        self.order.pop(connection, None)


class _Refused(Exception):
    """Raised from a parser callback: the request is answered with `status` and closed."""


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the head deadline, the waiting cap, the head limits
    and the method check (see the module's docstring). Pipelined requests are answered in
    order, a refusal included: it waits for the answers of the requests before it. At most
    MAX_PIPELINED parsed requests wait for their turn; the bytes after them are parsed as
    the queue shortens, and nothing more is read meanwhile. A malformed request is logged at
    debug (uvicorn: a warning, which a stranger could fill the log with)."""

    def __init__(self, *args: Any, waiting: _Waiting, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = waiting
        self._deadline: asyncio.TimerHandle | None = None
        self._refusal: Refusal = (400, "bad request", ())
        self._owed: tuple[Refusal, str] | None = None  # waits for the answers before it
        self._eof = self._draining = self._in_head = False
        self._headers = self._header_bytes = self._drained = 0
        self._unparsed = bytearray()  # received, not yet fed to the parser

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # An answer goes out as written: with Nagle's algorithm a body smaller than a
            # segment waited for the client's delayed ACK of the head, 40 ms a scrape
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        self._unparsed.clear()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client closed its side: finish the answers owed, then close."""
        if self._draining:
            self.transport.close()
            return None
        self._eof = True
        if self._answering() or self._owed is not None:
            return True
        if self._in_head:
            self._refuse((400, "incomplete request", ()))
            return True
        return None  # asyncio closes the connection

    def data_received(self, data: bytes) -> None:
        if self._draining:
            self._drained += len(data)
            if self._drained > LINGER_BYTES:
                self.transport.close()
            return
        if self._owed is not None:  # refused: what follows is never read
            return
        self._unset_keepalive_if_required()
        self._unparsed += data
        self._feed()

    def _feed(self) -> None:
        """Parse what was received, FEED_BYTES at a time, until MAX_PIPELINED requests wait;
        the rest stays unparsed (and reading paused) until the queue shortens."""
        while self._unparsed and self._owed is None and len(self.pipeline) < MAX_PIPELINED:
            chunk = bytes(self._unparsed[:FEED_BYTES])
            del self._unparsed[:FEED_BYTES]
            try:
                self.parser.feed_data(chunk)
            except httptools.HttpParserUpgrade as upgrade:
                # no upgrade here: the request is answered as it is, and the parser stopped
                # where it ended; what follows is the next request
                self._unparsed[:0] = chunk[upgrade.args[0] :]
            except httptools.HttpParserError as err:
                self._unparsed.clear()
                self._refuse(self._refusal, str(err))
        if self._unparsed:
            self.flow.pause_reading()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._headers = self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_LINE_BYTES:
            self._refusal = (414, "request line too long", ())
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        self._header_bytes += len(name) + len(value)
        if self._headers > MAX_HEADERS or self._header_bytes > MAX_HEADER_BYTES:
            self._refusal = (431, "request headers too large", ())
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_done()
        version = self.parser.get_http_version()
        method = self.parser.get_method()
        if version >= "2":
            self._refusal = (505, "HTTP version not supported", ())
            raise _Refused
        if version < "1" and method != b"GET":  # HTTP/0.9 knows only GET
            raise _Refused
        if method not in (b"GET", b"HEAD"):
            # Answered at once, its body never waited for (a body that never comes held the
            # connection); what the client still sends is drained, see _refuse
            line = f'"{method.decode()} {self.url.decode("latin-1")} HTTP/{version}" 405'
            log.debug("http.request", client=self.client[0] if self.client else "", line=line)
            self._refusal = (405, "method not allowed: use GET or HEAD", ALLOW)
            raise _Refused
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next pipelined request, if any
        if self.transport.is_closing():
            return
        if self._unparsed:
            self._feed()  # the requests held back while the queue was full
        if self._answering() or self._draining or self.transport.is_closing():
            return
        if self._owed is not None:
            self._refuse(*self._owed)
        elif self._eof:
            self.transport.close()
        else:
            self._unset_keepalive_if_required()  # the deadline below comes first
            self._await_head()

    def _answering(self) -> bool:
        """Whether a request read is not answered yet (the last one parsed is the last
        answered: pipelined requests are answered in order)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _await_head(self) -> None:
        self._head_done()
        self._deadline = self.loop.call_later(self._waiting.timeout_seconds, self._expire)
        self._waiting.add(self)

    def _head_done(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting.discard(self)

    def _expire(self) -> None:
        self._deadline = None
        self._waiting.discard(self)
        if self.transport.get_write_buffer_size():  # its last answer not read yet: cut off
            self.transport.abort()
        else:
            self.transport.close()

    def _refuse(self, refusal: Refusal, detail: str = "") -> None:
        """Answer the refusal and close, once the requests before it are answered. Before
        closing, what the client still sends is read and dropped for a moment: closing with
        unread data sends a reset, which can destroy the answer before the client reads it."""
        self._head_done()
        if self._answering():
            self._owed = (refusal, detail)
            self.flow.pause_reading()
            return
        self._owed = None
        status, reason, extra = refusal
        client = self.client[0] if self.client else ""
        log.debug("http.refused", client=client, status=status, reason=reason, detail=detail)
        body = f"{reason}\n".encode()
        phrase = http.HTTPStatus(status).phrase
        headers = b"".join(b"%s: %s\r\n" % pair for pair in extra)
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n%s"
            b"connection: close\r\n\r\n%s" % (status, phrase.encode(), len(body), headers, body)
        )
        if self._eof or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._draining = True
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def _listen(address: str) -> socket.socket:
    """A bound, listening socket on the first of `address`'s resolved addresses that binds."""
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
            return _bind(family, sockaddr)
        except OSError as err:
            first = first or err
            # Only an address this host cannot have moves on to the next one: a port in use
            # on 127.0.0.1 must not quietly become a listener on ::1 alone.
            if err.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                break
    reason = (first.strerror or str(first)) if first else "no address to bind"
    raise ConfigError(f"cannot listen on {address}: {reason}") from first


def _bind(family: socket.AddressFamily, sockaddr: Any) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and sockaddr[0] == "::":
            with contextlib.suppress(OSError, AttributeError):  # dual-stack where the OS allows
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
