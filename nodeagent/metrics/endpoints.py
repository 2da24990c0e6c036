"""What the endpoint answers: /metrics, /healthz, /readyz, as one ASGI application (server.py
serves it). Health checks are answered on the event loop (cheap, and never behind a scrape);
a scrape whose exposition is not already rendered, and a first bcrypt check of its password
(~70 ms), run on a few threads, so the loop keeps answering the others meanwhile. A scrape gets
the format its Accept and Accept-Encoding headers ask for (exposition.negotiate): OpenMetrics
or the text format, gzip or not.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from email.utils import formatdate
from typing import Any, TypeVar

from nodeagent.base.logs import get_logger
from nodeagent.metrics.exposition import Format, negotiate
from nodeagent.metrics.webconfig import BasicAuth

log = get_logger("nodeagent.metrics")

Check = Callable[[], tuple[bool, str]]
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = tuple[tuple[bytes, bytes], ...]
T = TypeVar("T")

TEXT = b"text/plain"
NOT_ALLOWED = b"method not allowed: use GET or HEAD\n"
NOT_FOUND = b"not found: try /metrics, /healthz, /readyz\n"
UNAUTHORIZED = b"unauthorized: /metrics needs basic auth\n"
# What /healthz and /readyz must not show a stranger: absolute paths and process ids.
_PATH = re.compile(r"(?<![\w.~-])/[^\s'\",;()]+")
_PID = re.compile(r"\b(pids?) [0-9]+(?:, ?[0-9]+)*")


def redacted(check: Check) -> Check:
    """`check` with paths and pids taken out of its text (`metrics.health-details` off)."""

    def answer() -> tuple[bool, str]:
        ok, text = check()
        return ok, _PID.sub(r"\1 <n>", _PATH.sub("<path>", text))

    return answer


class Endpoints:
    """The ASGI application. `exposition(fmt)` renders the exposition in a format; `cached`,
    where given, returns it when it is already rendered (else None) without waiting: such a
    scrape is answered on the loop, no thread hand-off. At most `max_requests` requests are
    answered at once; beyond, 503 at once. Methods other than GET and HEAD are answered 405
    without reading a body (server.py refuses them before they get here)."""

    def __init__(
        self,
        exposition: Callable[[Format], bytes],
        healthy: Check,
        ready: Check,
        *,
        executor: Executor,
        max_requests: int,
        cached: Callable[[Format], bytes | None] | None = None,
        auth: BasicAuth | None = None,
    ) -> None:
        self.exposition, self.cached = exposition, cached
        self.healthy, self.ready = healthy, ready
        self.executor, self.max_requests, self.auth = executor, max_requests, auth
        self.active = 0  # requests being answered now, their answers' sending included
        self._date = (0, b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no lifespan, no websocket: the server is set up so
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            extra = ((b"allow", b"GET, HEAD"), (b"connection", b"close"))
            await self._answer(scope, send, 405, NOT_ALLOWED, TEXT, extra)
        elif self.active >= self.max_requests:
            extra = ((b"retry-after", b"1"), (b"connection", b"close"))
            await self._answer(scope, send, 503, b"busy\n", TEXT, extra)
        else:
            self.active += 1
            try:
                await self._answer(scope, send, *await self._route(scope))
            finally:
                self.active -= 1

    async def _route(self, scope: Scope) -> tuple[int, bytes, bytes, Headers]:
        path = "/" + scope["path"].lstrip("/")  # as http.server: //metrics is /metrics
        if path == "/metrics":
            if self.auth is not None and not await self._authorized(scope):
                extra = ((b"www-authenticate", b'Basic realm="nodeagent"'),)
                return 401, UNAUTHORIZED, TEXT, extra
            fmt = negotiate(_header(scope, b"accept"), _header(scope, b"accept-encoding"))
            body = self.cached(fmt) if self.cached is not None else None
            if body is None:
                body = await self._off_loop(functools.partial(self.exposition, fmt))
            vary = ((b"vary", b"Accept, Accept-Encoding"),)
            encoding = ((b"content-encoding", b"gzip"),) if fmt.gzip else ()
            return 200, body, fmt.content_type.encode(), (*encoding, *vary)
        if path in ("/healthz", "/readyz"):
            ok, text = (self.healthy if path == "/healthz" else self.ready)()
            return 200 if ok else 503, (text + "\n").encode(), TEXT, ()
        return 404, NOT_FOUND, TEXT, ()

    async def _authorized(self, scope: Scope) -> bool:
        assert self.auth is not None
        header = _header(scope, b"authorization")
        if self.auth.known(header):  # passed before: no bcrypt
            return True
        return await self._off_loop(functools.partial(self.auth.check, header))

    async def _off_loop(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def _answer(
        self, scope: Scope, send: Send, status: int, body: bytes, ctype: bytes, extra: Headers
    ) -> None:
        client = scope.get("client") or ("", 0)
        target = scope["raw_path"] + (
            b"?" + scope["query_string"] if scope["query_string"] else b""
        )
        line = (
            f'"{scope["method"]} {target.decode("latin-1")} HTTP/{scope["http_version"]}" {status}'
        )
        log.debug("http.request", client=str(client[0]), line=line)
        headers = [(b"content-type", ctype), (b"content-length", b"%d" % len(body)),
                   (b"date", self._http_date()), *extra]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})  # uvicorn drops it for HEAD

    def _http_date(self) -> bytes:
        now = int(time.time())
        if self._date[0] != now:  # formatted once a second, not once a request
            self._date = (now, formatdate(now, usegmt=True).encode())
        return self._date[1]


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (names are lower case in the scope)."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)
