"""The agent's budgets, measured as ratios in one run (issue 32):

- agent RSS <= 96 MiB with `run --kube --dra` (an 8 x H200 emulated node in all-1g.18gb: 56
  slices, one pod on each; or, with --real, the GPUs of this machine), and what each library the
  agent loads costs (RSS of a fresh interpreter after each import, in the agent's order);
- `nodeagent status` <= 2 x `python -c "import pynvml"` (medians);
- scrape p99 <= 1 ms with one scraper, <= 5 ms with 4 concurrent scrapers (4 processes, each
  every 100 ms from a random phase);
- with 1,000 idle connections and 100 slow-header clients (a request head sent a byte every
  0.5 s) held open: /healthz and a scrape answered, p99 <= 20 ms.

The suite's own budget (<= 120 s on a fresh clone of 2 cores) is measured by `make test` there.

Run from the repository root in the project's .venv (kmock, from the test extra, is the API
server; the tests' fake kubelet lists the pods):

    python benchmarks/budgets.py [--real] [--agent-python PY] [--plot benchmarks/budgets.png]

RSS depends on what the interpreter has installed (with the test extra, structlog also loads
rich: 5 MiB): pass --agent-python a venv with only the runtime dependencies to measure the agent
as the image ships it.

Prints one table (budget, measured, limit, ratio) and the libraries' costs; writes a plot where
matplotlib is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import metrics as bench  # noqa: E402  (benchmarks/metrics.py: the node, the agent, scrapers)
import startup  # noqa: E402  (benchmarks/startup.py: timing a command against import pynvml)

# The libraries in the order `run --kube --dra` loads them, each as the agent uses it.
LIBRARIES = (
    ("python", "pass"),
    ("pynvml (nvidia-ml-py)", "import pynvml"),
    ("structlog", "import structlog"),
    ("PyYAML", "import yaml"),
    ("tenacity", "import tenacity"),
    ("prometheus-client", "import prometheus_client"),
    ("HTTP server", "import nodeagent.metrics.server"),
    ("kubernetes (ApiClient)", "from kubernetes import client; client.ApiClient()"),
    ("grpcio + protobuf", "import grpc; from nodeagent.kubelet.proto import dra_v1_pb2_grpc"),
    ("nodeagent (run --kube --dra)", "import nodeagent.agent.service, nodeagent.dra.k8s.driver"),
)


@dataclass(frozen=True)
class Budget:
    name: str
    measured: float
    limit: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.measured / self.limit


def library_costs() -> list[tuple[str, float]]:
    """(library, MiB of RSS it adds) in one fresh interpreter, importing in the agent's order."""
    script = "\n".join(
        [
            "import re, sys",
            "def rss():",
            "    text = open('/proc/self/status').read()",
            "    return int(re.search(r'VmRSS:\\s+(\\d+) kB', text).group(1)) / 1024",
            *[f"{code}\nprint({name!r}, rss(), flush=True)" for name, code in LIBRARIES],
        ]
    )
    out = subprocess.run(
        [*bench.AGENT_PYTHON, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    costs, before = [], 0.0
    for line in out:
        name, _, value = line.rpartition(" ")
        total = float(value)
        costs.append((name.strip("'\""), total - before if before else total))
        before = total
    return costs


def _get(port: int, path: str) -> float:
    """Seconds for one GET on a new connection (the answer read whole)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise SystemExit(f"GET {path}: HTTP {response.status}")
    return time.perf_counter() - t0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(int(0.99 * len(ordered)) - 1, 0)]


@contextmanager
def hostile_clients(port: int, idle: int, slow: int) -> Iterator[None]:
    """`idle` connections that send nothing and `slow` ones that send a request head a byte
    every 0.5 s, held open while the body runs (a connection the agent closes is opened
    again: the load stays)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    stop = threading.Event()
    head = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nX-Slow: " + b"a" * 4000

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=5)

    idlers = [connect() for _ in range(idle)]

    def trickle() -> None:
        slows = [[connect(), 0] for _ in range(slow)]
        while not stop.wait(0.5):
            for entry in slows:
                sock, sent = entry
                try:
                    sock.sendall(head[sent : sent + 1])
                    entry[1] = (sent + 1) % len(head)
                except OSError:
                    with contextlib.suppress(OSError):
                        sock.close()
                    with contextlib.suppress(OSError):
                        entry[0], entry[1] = connect(), 0
        for sock, _ in slows:
            sock.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    time.sleep(2.0)
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        for sock in idlers:
            sock.close()


def agent_budgets(real: bool, n: int) -> tuple[list[Budget], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if real:
            prefix: list[str] = []
            env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
            uuids: list[str] = []
            where = "this machine's GPUs"
        else:
            prefix, env, uuids = bench.emulated_node(tmp)
            where = "8 emulated H200, 56 slices, 56 pods"
        with bench.kube(tmp, uuids, env, dra=True) as (flags, kenv):
            proc, port = bench._start_agent(prefix, kenv, tuple(flags))
            try:
                bench._scrape(port, 200)  # warm: the exposition, the connection, the caches
                time.sleep(2.0)
                one, size, series = bench._scrape(port, n)
                four = bench._concurrent(proc.pid, port, 4, 0.1, n, 0.0)
                rss = bench._rss_mib(proc.pid)  # in service: warmed up, scraped, DRA published
                with hostile_clients(port, 1000, 100):
                    health = [_get(port, "/healthz") for _ in range(200)]
                    scrapes = [_get(port, "/metrics") for _ in range(200)]
                    rss_hostile = bench._rss_mib(proc.pid)
            finally:
                proc.terminate()
                proc.wait(30)
    budgets = [
        Budget(f"agent RSS, run --kube --dra ({where})", rss, 96.0, "MiB"),
        Budget("scrape p99, 1 scraper", p99(one) * 1e3, 1.0, "ms"),
        Budget("scrape p99, 4 scrapers (every 100 ms)", four["p99"], 5.0, "ms"),
        Budget("/healthz p99, 1,000 idle + 100 slow-header clients", p99(health) * 1e3, 20.0, "ms"),
        Budget("scrape p99, 1,000 idle + 100 slow-header clients", p99(scrapes) * 1e3, 20.0, "ms"),
    ]
    extra = {
        "series": series,
        "bytes": size,
        "scrape p50 ms": statistics.median(one) * 1e3,
        "RSS MiB with 1,100 hostile connections open": rss_hostile,
    }
    return budgets, extra


def status_budget(real: bool, runs: int) -> Budget:
    cmds = startup.commands("h200x8")[:2]
    python = bench.AGENT_PYTHON
    cmds = [
        startup.Command(cmds[0].label, [*python, *cmds[0].argv[1:]]),
        startup.Command(
            "status",
            [*python, "-m", "nodeagent", *([] if real else ["--simulate", "h200x8"]), "status"],
        ),
    ]
    timings = startup.measure(cmds, runs, 3, startup.clean_env())
    base, status = timings[0].median_seconds, timings[1].median_seconds
    return Budget(
        f"nodeagent status / import pynvml ({status * 1e3:.0f} / {base * 1e3:.0f} ms)",
        status / base,
        2.0,
        "x",
    )


def plot(budgets: list[Budget], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed; {path} not written)")
        return
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(budgets) + 1.5))
    names = [b.name for b in budgets][::-1]
    ratios = [b.ratio for b in budgets][::-1]
    ax.barh(names, ratios, color=["tab:green" if r <= 1 else "tab:red" for r in ratios])
    ax.axvline(1.0, color="black", linewidth=1)
    for y, b in enumerate(budgets[::-1]):
        ax.text(b.ratio, y, f" {b.measured:.2f} / {b.limit:g} {b.unit}", va="center", fontsize=8)
    ax.set_xlabel("measured / budget (1 = the budget)")
    ax.set_title("nodeagent budgets, one run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="the agent on this machine's GPUs")
    parser.add_argument(
        "--agent-python",
        help="the interpreter that runs the agent and the import costs, with its flags (e.g. a"
        " venv with only the runtime dependencies, as the image ships them: `V/bin/python`, or"
        " `python3 -S` with the wheels on PYTHONPATH); default: this one",
    )
    parser.add_argument("--scrapes", type=int, default=1000, help="scrapes per level")
    parser.add_argument("--status-runs", type=int, default=15)
    parser.add_argument("--plot", default=str(HERE / "budgets.png"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.agent_python:
        bench.AGENT_PYTHON[:] = args.agent_python.split()
    budgets, extra = agent_budgets(args.real, args.scrapes)
    budgets.append(status_budget(args.real, args.status_runs))
    costs = library_costs()
    print(f"\n{'budget':<62}{'measured':>10}{'limit':>8}  unit  ratio")
    for b in budgets:
        mark = "ok" if b.ratio <= 1 else "OVER"
        print(f"{b.name:<62}{b.measured:>10.2f}{b.limit:>8g}  {b.unit:<4}  {b.ratio:.2f} {mark}")
    print(
        f"(exposition: {extra['series']} series, {extra['bytes']} bytes; scrape p50 {extra['scrape p50 ms']:.2f} ms)"
    )
    print(f"\n{'library (in the agent order)':<34}{'RSS it adds, MiB':>18}")
    for name, mib in costs:
        print(f"{name:<34}{mib:>18.1f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"budgets": [asdict(b) for b in budgets], "libraries": costs, **extra}, indent=1
            )
        )
    plot(budgets, args.plot)


if __name__ == "__main__":
    main()
