"""The HTTP endpoint: /metrics, /healthz, /readyz."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

from nodeagent.errors import ConfigError
from nodeagent.logs import get_logger

log = get_logger("nodeagent.metrics")
# dcgm-exporter uses 9400; nodeagent takes the next port so both can run on one node.
DEFAULT_METRICS_ADDRESS = "0.0.0.0:9401"
Check = Callable[[], tuple[bool, str]]


def parse_address(value: str) -> tuple[str, int]:
    """'HOST:PORT' (or ':PORT') -> (host, port); raises ConfigError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"metrics address {value!r} must be HOST:PORT, e.g. 0.0.0.0:9401")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """Serves the registry and the health checks from a thread; `port` is the bound port."""

    def __init__(
        self, address: str, exposition: Callable[[], bytes], healthy: Check, ready: Check
    ) -> None:
        host, port = parse_address(address)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
            disable_nagle_algorithm = True  # headers and body leave at once, no delayed ACK

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, exposition(), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, text = (healthy if path == "/healthz" else ready)()
                    self._send(200 if ok else 503, (text + "\n").encode(), "text/plain")
                else:
                    self._send(404, b"not found: try /metrics, /healthz, /readyz\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http.request", line=format % args)

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as err:
            raise ConfigError(f"cannot listen on {address}: {err.strerror}") from err
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("metrics.listening", port=self.port)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
