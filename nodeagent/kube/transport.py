"""Requests to the API server through the official client's `ApiClient`.

nodeagent reads and writes Kubernetes objects as JSON (dicts), so it uses the client the way
the generated API classes do underneath: `ApiClient.param_serialize` (URL, query, headers, the
bearer token through the Configuration's refresh hook, the body) and `ApiClient.call_api` (the
urllib3 pool, TLS, proxy), and `ApiException` for an answer that is not 2xx. The typed API
classes (`CoreV1Api`, `ResourceV1Api`, ...) are not used: since kubernetes 37 each call is
validated with pydantic and their import loads the model classes, 27 MiB more of the agent's
memory (72 MiB against 45 MiB for `ApiClient` alone, measured with kubernetes 37.0.2) and
0.5 s more of start-up, for objects the agent reads as dicts.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client

from nodeagent.metrics.kube import KUBE_REQUESTS

ApiException = client.ApiException
Configuration = client.Configuration
USER_AGENT = "nodeagent (kubernetes-client)"


class BadAnswer(ValueError):
    """A 2xx answer that is no Kubernetes object: a web page (a proxy's or a portal's login,
    a server URL that names a web server), text that is not JSON, or JSON that is no object.
    Not retried: the server named is not the Kubernetes API."""


class Transport:
    """The API server's JSON answers through one `ApiClient` (its connection pool)."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self.api = client.ApiClient(configuration)
        self.api.user_agent = USER_AGENT

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        stream: bool = False,
    ) -> Any:
        """The JSON answer as Python data, or with `stream` the open urllib3 response (a
        watch). Raises ApiException (the client's own, with status and body) on an answer that
        is not 2xx, urllib3's errors for a connection that failed or timed out."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, body, post = self.api.param_serialize(
            method,
            path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        watch = str((query or {}).get("watch", "")).lower() == "true"
        try:
            response = self.api.call_api(method, url, headers, body, post, _request_timeout=timeout)
        except Exception:
            KUBE_REQUESTS.add(method, path, watch, "error")
            raise
        KUBE_REQUESTS.add(method, path, watch, str(response.status))
        if stream and 200 <= response.status <= 299:
            return response.response
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=response, body=data.decode("utf-8", "replace"), data=None
            )
        if not data:
            return None
        return _object(data, response, self.configuration.host)

    def close(self) -> None:
        self.api.close()


def _object(data: bytes, response: Any, host: str) -> dict[str, Any]:
    """The JSON object of a 2xx answer. Raises BadAnswer for anything else."""
    where = f"the server at {host}"
    headers = getattr(response, "headers", None) or {}
    content_type = str(headers.get("Content-Type") or headers.get("content-type") or "")
    if "html" in content_type.lower() or data.lstrip()[:1] == b"<":
        raise BadAnswer(f"{where} answered with a web page, not the Kubernetes API")
    try:
        value = json.loads(data)
    except ValueError:  # UnicodeDecodeError included
        raise BadAnswer(
            f"{where} answered {len(data)} bytes that are not JSON"
            + (f" ({content_type})" if content_type.isprintable() and content_type else "")
            + ", not the Kubernetes API"
        ) from None
    except RecursionError:
        raise BadAnswer(f"{where} answered JSON nested too deeply to read") from None
    if not isinstance(value, dict):
        raise BadAnswer(f"{where} answered JSON that is no Kubernetes object")
    return value


# What an OS error of a connection means, in the words of someone running a cluster.
_ERRNO_WORDS = {
    errno.ECONNREFUSED: "connection refused (nothing listens on that port)",
    errno.ECONNRESET: "the connection was reset",
    errno.EHOSTUNREACH: "no route to the host",
    errno.ENETUNREACH: "the network is unreachable",
    errno.ETIMEDOUT: "the connection timed out",
    errno.EPIPE: "the connection was closed",
    errno.EADDRNOTAVAIL: "the address is not available",
}
# OpenSSL's verify codes (X509_V_ERR_*) that a kubeconfig's CA or server name explain.
_UNTRUSTED = {18, 19, 20, 21, 2, 27}  # self-signed, self-signed in chain, unknown issuer, ...


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _tls(err: BaseException) -> str | None:
    """The TLS failure in `err`'s chain, in words; None when there is none."""
    for cause in _chain(err):
        if isinstance(cause, ssl.SSLCertVerificationError):
            code = getattr(cause, "verify_code", None)
            if code in _UNTRUSTED:
                return "its certificate is not signed by the kubeconfig's CA"
            if code == 10:
                return "its certificate has expired"
            if code == 9:
                return "its certificate is not valid yet (is this machine's clock right?)"
            if code in (62, 64):  # host name, IP address mismatch
                return "its certificate is not for that host name or address (tls-server-name?)"
            message = getattr(cause, "verify_message", None) or "it failed"
            return f"its certificate cannot be verified: {message}"
        if isinstance(cause, ssl.SSLError):
            reason = str(getattr(cause, "reason", "") or "")
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
                return "it does not speak TLS there (an http:// server?)"
            if "CERTIFICATE" in reason or "ALERT" in reason:
                return f"the TLS handshake failed ({reason.replace('_', ' ').lower()})"
            return "the TLS handshake failed" + (
                f" ({reason.replace('_', ' ').lower()})" if reason.isidentifier() else ""
            )
    if isinstance(err, client.ApiException) and "SSLError" in str(err.reason or ""):
        return "the TLS handshake failed"
    return None


def describe_failure(err: BaseException, host: str, timeout_seconds: float | None = None) -> str:
    """What went wrong reaching the API server at `host`, in our words ("cannot reach the
    Kubernetes API at https://10.0.0.1:6443: connection refused"): never urllib3's class
    names, OpenSSL's source lines or an OSError's repr."""
    where = f"cannot reach the Kubernetes API at {host}"
    tls = _tls(err)
    if tls is not None:
        return f"{where}: {tls}"
    within = f" within {timeout_seconds:g} s" if timeout_seconds else ""
    for cause in _chain(err):
        if isinstance(cause, (urllib3.exceptions.NameResolutionError, socket.gaierror)):
            return f"{where}: its host name does not resolve"
        if isinstance(cause, urllib3.exceptions.ReadTimeoutError):
            return f"{where}: no answer{within}"
        if isinstance(cause, urllib3.exceptions.ProxyError):
            return f"{where}: the proxy (proxy-url) refused or cannot be reached"
        if isinstance(cause, urllib3.exceptions.LocationParseError):
            return f"{where}: the URL cannot be parsed"
        if isinstance(cause, OSError) and cause.errno in _ERRNO_WORDS:
            return f"{where}: {_ERRNO_WORDS[cause.errno]}"
        if isinstance(cause, OSError) and cause.errno:
            return f"{where}: {os.strerror(cause.errno).lower()}"
    for cause in _chain(err):
        if isinstance(cause, (urllib3.exceptions.ConnectTimeoutError, TimeoutError)):
            return f"{where}: no connection{within}"
        if isinstance(cause, urllib3.exceptions.ProtocolError):
            return f"{where}: the connection was closed before the answer"
    return f"{where}: the connection failed"


# The longest watch line read. The API server takes no request body over 3 MiB (its largest
# object; etcd's default request limit, 1.5 MiB, is lower still), and writes an object back as
# one line of an event: with the event's envelope and JSON's escapes (Go's encoder writes `<` as
# the six bytes `\u003c`), the line of the largest object stays under 16 MiB. A longer line is
# no event of a Kubernetes API server, and reading on would hold it all in memory: a line that
# never ends grew the agent by 230-362 MiB in 15 s.
MAX_LINE_BYTES = 16 << 20
READ_BYTES = 1 << 16  # one read of a watch: a chunk's size the server declares is not trusted


class LineTooLong(BadAnswer):
    """A watch line over the bound: the watch is ended, and the informer backs off."""


def json_lines(response: Any, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[dict[str, Any]]:
    """The JSON objects of a watch, one a line, as they arrive (urllib3 response). Raises
    LineTooLong once a line exceeds `max_line_bytes` (before it is held whole), ValueError for
    a line that is not JSON."""
    pending = bytearray()
    for chunk in _chunks(response):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            start = end + 1
            if len(pending) > max_line_bytes:
                raise _too_long(max_line_bytes)
            event = _event(pending)
            pending.clear()
            if event is not None:
                yield event
        pending += chunk[start:]
        if len(pending) > max_line_bytes:
            raise _too_long(max_line_bytes)


def _chunks(response: Any) -> Iterator[bytes]:
    """The watch's bytes as they arrive, READ_BYTES at most at a time: a chunked answer (every
    API server's watch) chunk by chunk, a chunk the server says is huge in pieces; an answer
    that ends when the connection closes, what each read finds (read1: no wait for a full
    read, no read to the end)."""
    if getattr(response, "chunked", True):
        yield from response.stream(amt=READ_BYTES, decode_content=False)
        return
    while data := response.read1(READ_BYTES, decode_content=False):
        yield data


def _too_long(max_line_bytes: int) -> LineTooLong:
    mib, rest = divmod(max_line_bytes, 1 << 20)
    bound = f"{mib} MiB" if mib and not rest else f"{max_line_bytes} bytes"
    return LineTooLong(
        f"a watch line is over {bound}, longer than any event of a"
        " Kubernetes API server (its largest object is about 3 MiB): the watch was ended"
    )


def _event(line: bytes | bytearray) -> dict[str, Any] | None:
    """The event of one line; None for a blank line or JSON that is no object."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except RecursionError:  # a line of deep nesting: the caller's ValueError
        raise ValueError("a watch event nested too deeply to read") from None
    return event if isinstance(event, dict) else None
