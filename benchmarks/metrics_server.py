"""Which HTTP server library serves the metrics endpoint: each candidate serves the same thing
(the exposition of an emulated 8xH200 node in all-1g.18gb, 56 slices, rendered once, and a
/healthz) from a process of its own, measured from this one over loopback.

Candidates:
- prometheus-client: its own server (wsgiref's, a thread per connection, as
  start_http_server builds it), serving a WSGI app.
- cheroot: a thread pool (64 threads, the endpoint's cap) with idle keep-alive connections in
  a selector, timeout 5 s (a socket timeout: each byte that arrives starts it again).
- uvicorn (h11): uvicorn as it comes, pure-Python parser, serving an ASGI app.
- nodeagent (uvicorn, httptools): nodeagent.metrics.server as the agent runs it: uvicorn with
  httptools' parser and its protocol's head deadline, the exposition answered on the loop.
(waitress is not measured: it has no TLS at all, and the endpoint must serve the
exporter-toolkit's tls_server_config, client certificates included.)

Measured: p50/p99 scrape latency (keep-alive, as Prometheus scrapes) with 1 and 4 concurrent
scraper processes; /healthz p99 (a new connection each, as kubelet probes) and scrape p99
while 1,000 idle connections and 100 slow-header clients (a byte a second, slowloris) are held
open; RSS the library adds (importing and serving: after start, and after the load) over the
same process before the import.

Run (from the repository root): .venv/bin/python benchmarks/metrics_server.py
    [--scrapes 2000] [--plot benchmarks/metrics-server.png]
Prints a table and writes the plot; never passes or fails on time. ~1 minute.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

CANDIDATES = ["prometheus-client", "cheroot", "uvicorn-h11", "nodeagent"]
LABELS = {"prometheus-client": "prometheus-client\n(wsgiref, thread/conn)",
          "cheroot": "cheroot\n(64 threads)", "uvicorn-h11": "uvicorn\n(h11)",
          "nodeagent": "nodeagent\n(uvicorn, httptools)"}  # fmt: skip
IDLE, SLOW, PROBES = 1000, 100, 100
PROBE_TIMEOUT = 1.0  # a probe slower than this counts as failed (kubelet's default: 1 s)


def rss_mib() -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))


# -- the server process -----------------------------------------------------------------------


def serve(name: str, body: bytes) -> None:
    """Start candidate `name` on a free loopback port; print RSS before/after and the port."""
    raise_fd_limit()
    # What the agent imports anyway, out of the figure: the candidates' own cost remains.
    import prometheus_client  # noqa: F401

    import nodeagent.base.logs
    import nodeagent.metrics.webconfig
    import nodeagent.settings  # noqa: F401

    before = rss_mib()
    health = b"ok\n"
    ctype = "text/plain; version=0.0.4; charset=utf-8"

    def wsgi(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        out = body if environ["PATH_INFO"] == "/metrics" else health
        start("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(out)))])
        return [out]

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        out = body if scope["path"] == "/metrics" else health
        headers = [(b"content-type", ctype.encode()), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    if name == "prometheus-client":
        from wsgiref.simple_server import make_server

        from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

        httpd = make_server("127.0.0.1", 0, wsgi, ThreadingWSGIServer, handler_class=_SilentHandler)
        port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    elif name == "cheroot":
        from cheroot import wsgi as cheroot_wsgi

        server = cheroot_wsgi.Server(("127.0.0.1", 0), wsgi, numthreads=64, timeout=5)
        server.prepare()
        port = server.bind_addr[1]
        threading.Thread(target=server.serve, daemon=True).start()
    elif name == "uvicorn-h11":
        import asyncio

        import uvicorn

        sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        port = sock.getsockname()[1]
        config = uvicorn.Config(asgi, http="h11", lifespan="off", log_config=None,
                                access_log=False, timeout_keep_alive=5)  # fmt: skip
        server = uvicorn.Server(config)
        threading.Thread(target=lambda: asyncio.run(server.serve([sock])), daemon=True).start()
    else:
        from nodeagent.metrics.server import MetricsServer

        ns = MetricsServer("127.0.0.1:0", lambda _fmt: body, lambda: (True, "ok"),
                           lambda: (True, "ok"), cached=lambda _fmt: body)  # fmt: skip
        ns.start()
        port = ns.port
    time.sleep(0.5)
    print(f"{before:.2f} {rss_mib():.2f} {port}", flush=True)
    sys.stdin.read()  # until the parent closes the pipe


# -- the load ---------------------------------------------------------------------------------


def scraper(args: tuple[int, int]) -> list[float]:
    """`n` scrapes on one keep-alive connection (a new one when the server closes it); ms."""
    port, n = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            continue
        times.append((time.perf_counter() - start) * 1000)
        if resp.will_close:
            conn.close()
    conn.close()
    return times


def sweep(port: int, scrapers: int, scrapes: int) -> list[float]:
    with multiprocessing.get_context("fork").Pool(scrapers) as pool:
        pool.map(scraper, [(port, 20)] * scrapers)  # warm-up
        return [t for part in pool.map(scraper, [(port, scrapes)] * scrapers) for t in part]


def probe(port: int) -> float | None:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        conn.request("GET", "/healthz", headers={"Connection": "close"})
        ok = conn.getresponse().read() == b"ok\n"
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        conn.close()
    return (time.perf_counter() - start) * 1000 if ok else None


def connections(port: int, n: int) -> list[socket.socket]:
    """Up to `n` connections, 50 being opened at once (a server with a listen backlog of 5,
    prometheus-client's and cheroot's, drops SYNs: one at a time would take minutes); those
    that do not connect in 5 s are left out (the table's "held")."""

    def one(_: int) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5.0)
        except OSError:
            return None

    with ThreadPoolExecutor(50) as pool:
        return [sock for sock in pool.map(one, range(n)) if sock is not None]


@contextlib.contextmanager
def hostile(port: int) -> Iterator[int]:
    """IDLE idle connections and SLOW clients sending a request head a byte a second; yields
    how many connections are held."""
    idle = connections(port, IDLE)
    slow = connections(port, SLOW)
    stop = threading.Event()

    def trickle() -> None:
        for sock in slow:
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        while not stop.wait(1.0):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    time.sleep(0.5)
    try:
        yield len(idle) + len(slow)
    finally:
        stop.set()
        thread.join()
        for sock in idle + slow:
            sock.close()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("inf")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]  # fmt: skip


def measure(name: str, body_file: Path, scrapes: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", name, "--body", str(body_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        before, started, port_text = proc.stdout.readline().split()
        port = int(port_text)
        row: dict[str, Any] = {"name": name, "rss_started": float(started) - float(before)}
        one = sweep(port, 1, scrapes)
        four = sweep(port, 4, scrapes // 2)
        row.update(p50_1=pct(one, 50), p99_1=pct(one, 99), p50_4=pct(four, 50), p99_4=pct(four, 99))
        with hostile(port) as held:
            row["held"] = held
            probes: list[float] = []
            failed = 0
            for _ in range(PROBES):
                took = probe(port)
                if took is None:
                    failed += 1
                    if failed >= 5:  # each costs PROBE_TIMEOUT: enough to say it
                        break
                else:
                    probes.append(took)
            row.update(health_p99=pct(probes, 99) if not failed else float("inf"),
                       health_failed=failed, health_tried=len(probes) + failed)  # fmt: skip
            loaded = scraper((port, 200)) if not failed else []
            row["scrape_p99_hostile"] = pct(loaded, 99)
            row["rss_loaded"] = _rss_of(proc.pid) - float(before)
        return row
    finally:
        proc.kill()
        proc.wait()


def _rss_of(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def exposition(tmp: Path) -> bytes:
    from metrics import _nodeagent, emulated_node  # benchmarks/metrics.py

    prefix, env, _uuids = emulated_node(tmp)
    out = subprocess.run(_nodeagent(*prefix, "metrics"), check=True, capture_output=True, env=env)
    return out.stdout


def ms(value: float) -> str:
    return "fails" if value == float("inf") else f"{value:.2f}"


def table(rows: list[dict[str, Any]], body: int) -> None:
    print(f"\nscrape latency (ms; exposition {body / 1024:.0f} KiB, 56 slices), /healthz while "
          f"{IDLE} idle + {SLOW} slow-header connections are held, RSS added (MiB)")  # fmt: skip
    head = ("server", "p50 1", "p99 1", "p50 4", "p99 4", "held", "healthz p99", "scrape p99 held",
            "RSS started", "RSS loaded")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        health = ms(r["health_p99"]) if not r["health_failed"] else \
            f"{r['health_failed']}/{r['health_tried']} failed"  # fmt: skip
        print(" | ".join([r["name"], ms(r["p50_1"]), ms(r["p99_1"]), ms(r["p50_4"]), ms(r["p99_4"]),
                          str(r["held"]), health, ms(r["scrape_p99_hostile"]), f"{r['rss_started']:.1f}",
                          f"{r['rss_loaded']:.1f}"]))  # fmt: skip


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    fig, (lat, mem) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1.3]})
    series = [("p99_1", "scrape p99, 1 scraper"), ("p99_4", "scrape p99, 4 scrapers"),
              ("health_p99", "/healthz p99, 1,100 held connections")]  # fmt: skip
    width = 0.27
    for i, (key, label) in enumerate(series):
        values = [min(r[key], 1000.0) for r in rows]  # a failure drawn at 1 s
        xs = [x + (i - 1) * width for x in range(len(rows))]
        bars = lat.bar(xs, values, width, label=label)
        for bar, r in zip(bars, rows, strict=True):
            if r[key] == float("inf"):
                lat.annotate("fails", (bar.get_x() + width / 2, 1000), ha="center", fontsize=7)
    lat.set_yscale("log")
    lat.axhline(1, color="grey", lw=0.6, ls="--")
    lat.axhline(5, color="grey", lw=0.6, ls=":")
    lat.set_xticks(range(len(rows)), [LABELS[r["name"]] for r in rows], fontsize=7)
    lat.set_ylabel("ms (log)")
    lat.set_title("latency (budgets: 1 ms one scraper, 5 ms four)", fontsize=9)
    lat.legend(fontsize=7)
    mem.bar(range(len(rows)), [r["rss_loaded"] for r in rows], color="tab:grey")
    mem.set_xticks(range(len(rows)), [r["name"].split("-")[0] for r in rows], fontsize=7,
                   rotation=20)  # fmt: skip
    mem.set_ylabel("MiB")
    mem.set_title("RSS added, after the load", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--plot", type=Path, default=REPO / "benchmarks" / "metrics-server.png")
    ap.add_argument("--only", nargs="*", choices=CANDIDATES, default=CANDIDATES)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--body", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.body.read_bytes())
        return 0
    raise_fd_limit()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        body = exposition(Path(tmp))
        print(f"emulated node and its exposition in {time.monotonic() - start:.0f} s", flush=True)
        body_file = Path(tmp) / "exposition.txt"
        body_file.write_bytes(body)
        rows = []
        for name in args.only:
            start = time.monotonic()
            rows.append(measure(name, body_file, args.scrapes))
            print(f"measured {name} in {time.monotonic() - start:.0f} s", flush=True)
    table(rows, len(body))
    plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
