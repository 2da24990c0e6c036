"""What the server's selector thread decides on its own: whether a request head is complete,
and the answers it gives without a handler thread (a plain scrape, the health checks).

The selector reads each connection's request head into a buffer as bytes arrive, so a client
that sends half a request and stalls (slowloris) costs a buffer and a file descriptor, never
one of the handler threads; liveness (`/healthz`) is answered here too, so it never waits for
a handler thread, however many are busy. Pure functions: no sockets here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate

from prometheus_client import CONTENT_TYPE_LATEST

from nodeagent.metrics.webconfig import BasicAuth

HEAD_LIMIT = 65536 + 2  # http.server's request-line limit: a longer head is the handler's
_BLANK_LINE = re.compile(rb"\n\r?\n")
_QUICK = re.compile(
    rb"(GET|HEAD) (/metrics|/healthz|/readyz)(?:\?[^ \r\n]*)? HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*\r\n)*)\r\n"
)
# Headers that change how a request is handled: the handler path knows them all.
_NOT_QUICK = re.compile(rb"(?im)^(?:expect|content-length|transfer-encoding):")
_CLOSE = re.compile(rb"(?im)^connection:[^\r\n]*\bclose\b")
_KEEP = re.compile(rb"(?im)^connection:[ \t]*keep-alive[ \t]*\r?$")
MAX_HEADER_LINES = 32  # Prometheus sends 5, kubelet's probes 4; more take the handler's limits
MAX_QUICK_BYTES = 8192  # a scrape's head is a few hundred bytes; a longer one, the handler's

_AUTHORIZATION = re.compile(rb"(?im)^authorization:[ \t]*([^\r\n]*?)[ \t]*\r?$")
# What /healthz and /readyz must not show a stranger: absolute paths and process ids.
_PATH = re.compile(r"(?<![\w.~-])/[^\s'\",;()]+")
_PID = re.compile(r"\b(pids?) [0-9]+(?:, ?[0-9]+)*")

Check = Callable[[], tuple[bool, str]]


@dataclass(frozen=True)
class Endpoints:
    """What the server answers with: the exposition, the two checks, and who may scrape."""

    exposition: Callable[[], bytes]
    healthy: Check
    ready: Check
    auth: BasicAuth | None = None  # basic auth for /metrics; the checks answer without it


def redacted(check: Check) -> Check:
    """`check` with paths and pids taken out of its text (`metrics.health-details` off)."""

    def answer() -> tuple[bool, str]:
        ok, text = check()
        return ok, _PID.sub(r"\1 <n>", _PATH.sub("<path>", text))

    return answer


def authorization(head: bytes) -> str | None:
    """The Authorization header's value in a request head, or None."""
    match = _AUTHORIZATION.search(head)
    return match.group(1).decode("latin-1") if match else None


def head_complete(buffer: bytes) -> bool:
    """Whether `buffer` holds a whole request head, or as much as the handler needs to answer
    (a request line that cannot have headers, or more than a head may be)."""
    if len(buffer) >= HEAD_LIMIT or _BLANK_LINE.search(buffer):
        return True
    line, found, _ = buffer.partition(b"\n")
    # HTTP/0.9 ("GET /path") and garbage are answered from the request line alone.
    return bool(found) and len(line.split()) != 3


def quick_answer(head: bytes, server: bytes, e: Endpoints) -> tuple[bytes, bool] | None:
    """The whole answer to `head` and whether the connection stays open, when `head` is
    exactly one plain HTTP/1.1 GET or HEAD of /metrics, /healthz or /readyz (a scrape under
    basic auth: with credentials that passed before); else None (the handler path answers
    it, byte for byte as http.server does)."""
    match = _QUICK.fullmatch(head) if len(head) <= MAX_QUICK_BYTES else None
    if match is None:
        return None
    method, path, headers = match.groups()
    if headers.count(b"\n") > MAX_HEADER_LINES or _NOT_QUICK.search(headers):
        return None
    closing = bool(_CLOSE.search(headers))
    if not closing and re.search(rb"(?im)^connection:", headers) and not _KEEP.search(headers):
        return None  # an odd Connection header: the handler's rules
    if path == b"/metrics":
        if e.auth is not None and not e.auth.known(authorization(headers)):
            return None  # bcrypt (~70 ms) or a 401: the handler's, not the selector's
        code, body, ctype = b"200 OK", e.exposition(), CONTENT_TYPE_LATEST.encode()
    else:
        ok, text = (e.healthy if path == b"/healthz" else e.ready)()
        code = b"200 OK" if ok else b"503 Service Unavailable"
        body, ctype = (text + "\n").encode(), b"text/plain"
    parts = [
        b"HTTP/1.1 ", code, b"\r\nServer: ", server,
        b"\r\nDate: ", formatdate(usegmt=True).encode(),
        b"\r\nContent-Type: ", ctype,
        b"\r\nContent-Length: ", str(len(body)).encode(),
    ]  # fmt: skip
    if closing:
        parts.append(b"\r\nConnection: close")
    parts.append(b"\r\n\r\n")
    if method == b"GET":
        parts.append(body)
    return b"".join(parts), not closing
