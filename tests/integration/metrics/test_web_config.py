"""TLS and basic auth of the metrics endpoint from exporter-toolkit's web config file: a real
TLS handshake with generated certificates (openssl), client certificates, passwords checked
with bcrypt, a bad file refused with its position, and health texts without paths or pids."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.metrics.server import MetricsServer
from nodeagent.metrics.webconfig import load_web_config
from tests.integration.metrics.test_endpoint_hostile import connection_threads, exposing
from tests.support.cli import Result, assert_one_error
from tests.support.metrics import http_get, prometheus_server, prometheus_tool, wait_for

EXPOSITION = b"# TYPE up gauge\nup 1.0\n"
TIMEOUT = 10.0
Cli = Callable[..., Result]
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(folder: Path, name: str, subject: str, extension: str) -> None:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=folder)  # fmt: skip
    (folder / f"{name}.ext").write_text(extension + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
             cwd=folder)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all from openssl."""
    folder = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=nodeagent test CA", cwd=folder)  # fmt: skip
    _signed(folder, "server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1")
    _signed(folder, "client", "/CN=prometheus", "extendedKeyUsage=clientAuth")
    return folder


PASSWORD_HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def serve(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], MetricsServer]:
    """Start a server with this web config (a readiness text holding a pid and a path)."""

    def start(config: str) -> MetricsServer:
        path = tmp_path / "web.yml"
        path.write_text(config)
        server = MetricsServer(
            "127.0.0.1:0",
            exposing(EXPOSITION),
            lambda: (True, "ok"),
            lambda: (False, "mps: daemon pid 4242 left /run/nvidia/mps/nvidia.com/gpu/pipe"),
            web=load_web_config(path),
        )
        request.addfinalizer(server.stop)
        server.start()
        return server

    return start


def _client_context(pki: Path, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return ctx


def _get(
    port: int, path: str = "/metrics", ctx: ssl.SSLContext | None = None, **headers: str
) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT, context=ctx)
        if ctx
        else http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    )
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


def tls_config(pki: Path, extra: str = "") -> str:
    return (
        f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n{extra}"
    )


def test_a_tls_scrape_is_answered_after_a_real_handshake(
    pki: Path, serve: Callable[[str], MetricsServer]
) -> None:
    server = serve(tls_config(pki, "  min_version: TLS13\n"))
    status, body, _ = _get(server.port, ctx=_client_context(pki))
    assert (status, body) == (200, EXPOSITION)
    assert _get(server.port, "/healthz", ctx=_client_context(pki))[:2] == (200, b"ok\n")
    old = _client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):  # below min_version: no handshake
        _get(server.port, ctx=old)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        _get(server.port)  # plain HTTP to the TLS port gets no HTTP answer


def test_client_certificates_are_required_when_asked(
    pki: Path, serve: Callable[[str], MetricsServer]
) -> None:
    mtls = f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki / 'ca.crt'}\n"
    server = serve(tls_config(pki, mtls))
    assert _get(server.port, ctx=_client_context(pki, cert=True))[:2] == (200, EXPOSITION)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        _get(server.port, ctx=_client_context(pki))  # no client certificate


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_basic_auth_guards_the_scrape_not_the_probes(
    pki: Path, serve: Callable[[str], MetricsServer], tls: bool
) -> None:
    users = f"basic_auth_users:\n  prometheus: {PASSWORD_HASH}\n"
    server = serve((tls_config(pki) if tls else "") + users)
    ctx = _client_context(pki) if tls else None
    right = {"Authorization": _basic("prometheus", "s3cret")}
    for _ in range(2):  # bcrypt once, then the cached pass (the selector's quick path)
        assert _get(server.port, ctx=ctx, **right)[:2] == (200, EXPOSITION)
    for headers in ({}, {"Authorization": _basic("prometheus", "wrong")},
                    {"Authorization": _basic("nobody", "s3cret")},
                    {"Authorization": "Bearer abc"}):  # fmt: skip
        status, body, resp = _get(server.port, ctx=ctx, **headers)
        assert status == 401 and EXPOSITION not in body
        assert resp.getheader("WWW-Authenticate") == 'Basic realm="nodeagent"'
    assert _get(server.port, "/healthz", ctx=ctx)[:2] == (200, b"ok\n")


def test_health_texts_show_no_paths_or_pids_unless_asked() -> None:
    reason = "mps: daemon pid 4242 left /run/nvidia/mps/nvidia.com/gpu/pipe behind"
    answers = []
    for details in (False, True):
        server = MetricsServer(
            "127.0.0.1:0", exposing(EXPOSITION), lambda: (True, "ok"), lambda: (False, reason),
            details=details,
        )  # fmt: skip
        server.start()
        try:
            answers.append(_get(server.port, "/readyz")[:2])
        finally:
            server.stop()
    assert answers == [
        (503, b"mps: daemon pid <n> left <path> behind\n"),
        (503, (reason + "\n").encode()),
    ]


@pytest.mark.parametrize(
    ("text", "position", "words"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  ciphers: x\n", "4:3",
         "tls_server_config has an unknown key 'ciphers'"),
        ("basic_auth_users: {}\nrate_limit: {interval: 1s}\n", "2:1",
         "'rate_limit' is not supported by nodeagent"),
        ("tls_server_config:\n  cert_file: a\n", "1:1", "tls_server_config needs key_file"),
        ("basic_auth_users:\n  alice: hunter2\n", "2:10", "must be a bcrypt hash"),
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
         "2:14", "cannot read tls_server_config.cert_file /nonexistent.crt"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n"
         "  max_version: TLS12\n", "4:16",
         "tls_server_config.min_version TLS13 is above max_version TLS12: no TLS version is left"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  max_version: TLS11\n", "4:16",
         "min_version TLS12 is above max_version TLS11"),
        ("tls: {}\n", "1:1", "unknown key 'tls'"),
        ("- a\n", "1:1", "must be a mapping"),
    ],
    ids=["unknown-tls-key", "toolkit-only", "no-key-file", "plain-password", "missing-cert",
         "min-above-max", "max-below-default-min", "unknown-top", "a-list"],
)  # fmt: skip
def test_a_bad_web_config_names_its_position(
    tmp_path: Path, text: str, position: str, words: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_web_config(path)
    assert str(err.value).startswith(f"{path}:{position}: ") and words in str(err.value)


def test_client_auth_needs_a_ca_and_a_known_name(pki: Path, tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text(tls_config(pki, "  client_auth_type: RequireAndVerifyClientCert\n"))
    with pytest.raises(ConfigError, match="needs client_ca_file"):
        load_web_config(path)
    path.write_text(tls_config(pki, "  client_auth_type: Sometimes\n"))
    with pytest.raises(ConfigError, match="'Sometimes' is none of NoClientCert"):
        load_web_config(path)


@pytest.mark.parametrize(
    ("text", "words"),
    [("tls_server_config:\n  cert_file: a\n  key_file: b\n  ciphers: x\n",
      ("4:3", "unknown key 'ciphers'")),
     ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n"
      "  max_version: TLS12\n", ("4:16", "min_version TLS13 is above max_version TLS12"))],
    ids=["unknown-key", "min-above-max"],
)  # fmt: skip
def test_run_refuses_a_bad_web_config_with_exit_2(
    cli: Cli, tmp_path: Path, text: str, words: tuple[str, str]
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with socket.socket() as probe:  # a free port: the agent must fail before listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    res = cli("--simulate", "h200", "run", "--metrics-address", f"127.0.0.1:{port}",
              "--web.config.file", str(path))  # fmt: skip
    assert_one_error(res, 2, f"{path}:{words[0]}", words[1])


def test_prometheus_scrapes_over_tls_with_basic_auth(
    pki: Path, serve: Callable[[str], MetricsServer], tmp_path: Path
) -> None:
    """A real Prometheus: the job with the CA and the password is up, the one with a wrong
    password is down."""
    binary = prometheus_tool("prometheus")
    server = serve(tls_config(pki) + f"basic_auth_users:\n  prometheus: {PASSWORD_HASH}\n")
    job = (
        "  - job_name: NAME\n    scheme: https\n"
        f"    tls_config: {{ca_file: {pki / 'ca.crt'}}}\n"
        "    basic_auth: {username: prometheus, password: PASSWORD}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n"
    )
    config = (
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
        + job.replace("NAME", "right").replace("PASSWORD", "s3cret")
        + job.replace("NAME", "wrong").replace("PASSWORD", "guess")
    )
    with prometheus_server(binary, tmp_path, config) as base:

        def up() -> dict[str, str]:
            query = urllib.parse.urlencode({"query": "up"})
            status, body = http_get(f"{base}/api/v1/query?{query}")
            results = json.loads(body)["data"]["result"] if status == 200 else []
            found = {r["metric"]["job"]: r["value"][1] for r in results}
            return found if set(found) == {"right", "wrong"} else {}

        assert wait_for(up, "both jobs scraped") == {"right": "1", "wrong": "0"}


def test_half_sent_tls_handshakes_hold_no_thread(
    pki: Path, serve: Callable[[str], MetricsServer]
) -> None:
    """50 clients send the start of a ClientHello and stall: the handshake waits on the
    selector thread, so a real client still gets its answer and no handler thread is held."""
    server = serve(tls_config(pki))
    stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
               for _ in range(50)]  # fmt: skip
    try:
        for sock in stalled:
            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        assert _get(server.port, "/healthz", ctx=_client_context(pki))[:2] == (200, b"ok\n")
        assert connection_threads(server.port) <= 1  # the one that answered, kept for reuse
        # the answered client has closed; the server notices it when its thread next runs
        wait_for(lambda: server.active_connections == 0, "no connection held", timeout=10)
    finally:
        for sock in stalled:
            sock.close()
