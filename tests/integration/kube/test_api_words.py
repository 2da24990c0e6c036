"""What `run --kube` says when the API server cannot be reached or is no API server: one
sentence in our words and exit 3, never urllib3's class names (NewConnectionError,
ProtocolError, ReadTimeoutError), OpenSSL's source line `(_ssl.c:1006)` or `[Errno 111]`.
An HTML page answered with 200 was "internal error" (exit 4). The servers are local: a closed
port, a TLS server with a self-signed certificate, and sockets that answer what each case needs."""

from __future__ import annotations

import functools
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.kube import api
from tests.support.cli import Result
from tests.support.words import assert_our_words

TLS = Path(__file__).resolve().parents[2] / "fixtures" / "tls"
HTML = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 30\r\nConnection: close\r\n"
    b"\r\n<html><body>login</body></html>"[:-1]
)


def _answer(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )  # fmt: skip


class Server:
    """A local server: each connection gets `reply` (bytes; None: held open, never answered;
    b"": closed once the request is read), over TLS with the test certificate when `tls`."""

    def __init__(self, reply: bytes | None, tls: bool = False) -> None:
        self.reply, self.tls = reply, tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS / "cert.crt", TLS / "plain.key")
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                if self.tls:
                    conn = context.wrap_socket(conn, server_side=True)
                if self.reply is None:
                    self.held.append(conn)
                    continue
                conn.recv(65536)  # the request read: a close is a close, not a reset
                conn.sendall(self.reply)
            except (OSError, ssl.SSLError):
                pass  # the client refused our certificate: what the case wants
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(reply: bytes | None, tls: bool = False) -> Server:
        servers.append(Server(reply, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def _kubeconfig(tmp: Path, server: str, ca: bool = False) -> str:
    cluster = f'{{server: "{server}"'
    if ca:
        cluster += f', certificate-authority: "{TLS / "cert.crt"}"'
    (tmp / "kc").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {cluster}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: u, user: {token: abc}}]\n"
    )
    return str(tmp / "kc")


# case -> (scheme, server reply or "closed", TLS server?, CA in the kubeconfig?, words)
CASES: dict[str, tuple[str, bytes | str | None, bool, bool, tuple[str, ...]]] = {
    "closed-port": ("https", "closed", False, False, ("connection refused",)),
    "self-signed": ("https", b"", True, False, ("not signed by the kubeconfig's CA",)),
    "other-host-name": ("https", b"", True, True, ("not for that host name or address",)),
    "html-200": ("http", HTML, False, False, ("answered with a web page",)),
    "json-list-200": ("http", _answer(b"[1, 2]"), False, False, ("no Kubernetes object",)),
    "text-200": ("http", _answer(b"hello", b"text/plain"), False, False, ("not JSON",)),
    "plain-http-for-https": ("https", HTML, False, False, ("does not speak TLS",)),
    "silent": ("http", None, False, False, ("no answer within 0.5 s",)),
    "hang-up": ("http", b"", False, False, ("closed before the answer",)),
}


@pytest.mark.parametrize("case", CASES)
def test_an_api_server_that_cannot_be_used_is_one_sentence_in_our_words(
    tmp_path: Path,
    cli: Callable[..., Result],
    serve: Callable[..., Server],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    scheme, reply, tls, ca, words = CASES[case]
    port = _closed_port() if reply == "closed" else serve(reply, tls).port
    assert not isinstance(reply, str) or reply == "closed"
    server = f"{scheme}://127.0.0.1:{port}"
    # The retries (30 s) and the request timeout (10 s) shortened: the same sentence, sooner.
    fast = functools.partial(api.KubeSettings, retry_seconds=0.3, request_timeout_seconds=0.5)
    monkeypatch.setattr(api, "KubeSettings", fast)
    res = cli("--simulate", "h200", "--log-level", "error", "run", "--kube", "--node-name", "n",
              "--metrics-address",
              "127.0.0.1:0", "--kubeconfig", _kubeconfig(tmp_path, server, ca))  # fmt: skip
    line = assert_our_words(res, 3, *words)
    assert f"cannot reach the Kubernetes API at {server}" in line or "the server at" in line
