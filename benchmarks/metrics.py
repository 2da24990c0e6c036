"""Metrics benchmark: scrape latency, agent RSS and CPU per scrape.

1. Emulated 8xH200 node, 7 slices each (56 slices), some under load: 1000 scrapes of a
   `nodeagent run` process over loopback HTTP (keep-alive, as Prometheus scrapes).
2. The same node with `--kube`: a loopback API server (kmock, from the tests) and the tests'
   fake kubelet pod-resources socket with one pod on each slice (56 attributed). Then 1, 4, 16
   concurrent scrapers back to back, and 16 each scraping every 100 ms: as 16 processes, and
   as 16 connections of one client process (the scrapers' own CPU out of the agent's latency,
   as for Prometheus servers on other machines); also 16 every 15 ms from one process.
3. Where a real NVIDIA driver is present (the GPU machine): the same against the real GPUs,
   and `nvidia-smi --query-gpu=...` for the same fields, in one run.
4. Idle cost: the agent on the emulated node, its CPU over --idle-seconds (60) with no scrape,
   then with one scrape every 15 s (--only-idle: this table alone; --baseline REV: the same
   for git revision REV's agent, runs alternating, for a before/after on one machine).

Run (in the project's .venv, from the repository root):
    .venv/bin/python benchmarks/metrics.py [--scrapes N] [--plot FILE] [--agent-python PY]
        [--idle-seconds S] [--only-idle] [--baseline REV] [--repeat N] [--idle-plot FILE]
Prints tables (plots of the sweep and of the idle cost where matplotlib is importable); never
passes or fails on time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import multiprocessing
import os
import random
import re
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Row = dict[str, Any]

NVIDIA_SMI_FIELDS = "index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,mig.mode.current"


AGENT_PYTHON = [sys.executable]  # --agent-python: e.g. a venv with only the runtime dependencies


def _nodeagent(*args: str) -> list[str]:
    return [*AGENT_PYTHON, "-m", "nodeagent", *args]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wakeups(pid: int) -> int:
    """Times the agent's threads went to sleep and were woken (voluntary context switches,
    all threads): an idle agent's timer wake-ups show here."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            status = (task / "status").read_text()
            total += int(status.split("voluntary_ctxt_switches:", 1)[1].split()[0])
    return total


def _rss_mib(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def _start_agent(
    prefix: list[str], env: dict[str, str], flags: tuple[str, ...] = (), cwd: Path | None = None
) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        _nodeagent(*prefix, "run", "--metrics-address", "127.0.0.1:0", *flags),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = re.search(r"metrics on port (\d+)", line)
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the agent did not start: {proc.stderr.read()}")


def _scrape(port: int, n: int) -> tuple[list[float], int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies = []
    body = b""
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        latencies.append(time.perf_counter() - t0)
    conn.close()
    return latencies, len(body), _count_series(body)


def _count_series(body: bytes) -> int:
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))


def _scraper(port: int, n: int, period: float, go: Any, out: Any) -> None:
    """One scraper process: a keep-alive connection, `n` scrapes after `go`: back to back
    (period 0), or one every `period` seconds from a random phase."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(3):
        conn.request("GET", "/metrics")
        conn.getresponse().read()
    go.wait()
    latencies = []
    start = time.monotonic()
    due = start + random.uniform(0, period)
    for _ in range(n):
        if period:
            time.sleep(max(due - time.monotonic(), 0))
            due += period
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        latencies.append(time.perf_counter() - t0)
    out.put((start, time.monotonic(), latencies))
    conn.close()


def _concurrent(
    pid: int, port: int, scrapers: int, period: float, total: int, idle_rate: float
) -> Row:
    """`scrapers` processes (own GILs, as separate Prometheus servers are) scrape at once.
    Period 0, closed-loop: each its next scrape as soon as the last answer is read, saturating:
    on a machine of few cores the latency is then mostly waiting for CPU behind the other
    scrapers. Period > 0: each scrapes every `period` s, phases random (Prometheus servers)."""
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    each = max(total // scrapers, 1)
    procs = [
        ctx.Process(target=_scraper, args=(port, each, period, go, out)) for _ in range(scrapers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0 + 0.1 * scrapers)  # all started and connected
    cpu0 = _cpu_seconds(pid)
    go.set()
    results = [out.get(timeout=300) for _ in procs]
    cpu1 = _cpu_seconds(pid)
    for proc in procs:
        proc.join(30)
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    lat = [x for r in results for x in r[2]]
    return _level(
        scrapers, period, "processes", lat, end - start, cpu1 - cpu0 - idle_rate * (end - start)
    )


def _level(
    scrapers: int, period: float, client: str, lat: list[float], seconds: float, cpu: float
) -> Row:
    """One row of the sweep: `lat` the scrapes' latencies over `seconds`, `cpu` the agent's
    CPU seconds for them (idle work taken out)."""
    return {
        "scrapers": scrapers,
        "period": period,
        "client": client,
        "scrapes": len(lat),
        **_percentiles(lat),
        "rate": len(lat) / seconds,
        "cpu": max(cpu, 0.0) / len(lat) * 1e3,
    }


REQUEST = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: identity\r\n\r\n"


def _multiplexed(
    pid: int, port: int, scrapers: int, period: float, total: int, idle_rate: float
) -> Row:
    """`scrapers` keep-alive connections from ONE client process, each scraping every `period`
    s from a random phase: the scrapers' own CPU (16 Python processes on 2 cores) stays out of
    the agent's latency, as it does for Prometheus servers on other machines. Latency runs from
    when a scrape was due (a late send counts) to the last byte of the answer."""
    each = max(total // scrapers, 1)
    sel = selectors.DefaultSelector()
    conns = []
    start = time.monotonic() + 0.5
    for _ in range(scrapers):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        conn = {"sock": sock, "due": start + random.uniform(0, period), "left": each,
                "busy": False, "buf": bytearray(), "need": -1}  # fmt: skip
        sel.register(sock, selectors.EVENT_READ, conn)
        conns.append(conn)
    lat: list[float] = []
    cpu0 = _cpu_seconds(pid)
    while len(lat) < each * scrapers:
        now = time.monotonic()
        waits = []
        for c in conns:
            if not c["busy"] and c["left"]:
                if c["due"] <= now:
                    c["sock"].sendall(REQUEST)
                    c["busy"], c["buf"], c["need"] = True, bytearray(), -1
                else:
                    waits.append(c["due"] - now)
        for key, _ in sel.select(min(waits, default=1.0)):
            c = key.data
            chunk = c["sock"].recv(1 << 18)
            if not chunk:
                raise SystemExit("the agent closed a scraper's connection")
            c["buf"] += chunk
            if c["need"] < 0 and b"\r\n\r\n" in c["buf"]:
                head, _, _ = bytes(c["buf"]).partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                c["need"] = len(head) + 4 + int(length.group(1) if length else 0)
            if 0 <= c["need"] <= len(c["buf"]):
                done = time.monotonic()
                lat.append(done - c["due"])
                c["busy"], c["left"] = False, c["left"] - 1
                c["due"] += period
    end = time.monotonic()
    cpu = _cpu_seconds(pid) - cpu0 - idle_rate * (end - start)
    for c in conns:
        c["sock"].close()
    return _level(scrapers, period, "1 process", lat, end - start, cpu)


def _percentiles(lat: list[float]) -> Row:
    lat = sorted(lat)
    return {
        "p50": statistics.median(lat) * 1e3,
        "p99": lat[max(int(0.99 * len(lat)) - 1, 0)] * 1e3,
        "max": lat[-1] * 1e3,
    }


def measure(
    label: str,
    prefix: list[str],
    env: dict[str, str],
    n: int,
    sweep: tuple[tuple[int, float, str], ...] = (),
    flags: tuple[str, ...] = (),
) -> Row:
    """Start the agent, warm it up, then: RSS, 1 scraper x `n` scrapes (with the exposition's
    size), and for each level of `sweep` that many concurrent scrapers, `n` scrapes in all."""
    proc, port = _start_agent(prefix, env, flags)
    try:
        time.sleep(3)  # samplers warm: inventory read, two GPM samples
        _scrape(port, 50)
        rss = _rss_mib(proc.pid)
        idle0 = _cpu_seconds(proc.pid)
        t0 = time.monotonic()
        time.sleep(2)
        idle_rate = (_cpu_seconds(proc.pid) - idle0) / (time.monotonic() - t0)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        lat, size, series = _scrape(port, n)
        elapsed = time.monotonic() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0 - idle_rate * elapsed
        levels = [
            (_multiplexed if how == "mux" else _concurrent)(proc.pid, port, c, t, n, idle_rate)
            for c, t, how in sweep
        ]
        rss_after = _rss_mib(proc.pid)
        pods = _pod_series(port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "label": label,
        "series": series,
        "pods": pods,
        "bytes": size,
        **_percentiles(lat),
        "rate": n / elapsed,
        "cpu": max(cpu, 0.0) / n * 1e3,
        "rss": rss,
        "rss_after": rss_after,
        "sweep": levels,
    }


def _pod_series(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return sum(1 for line in body.splitlines() if line.startswith("nodeagent_slice_pod_info{"))


def emulated_node(tmp: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """The node: 8 emulated H200 in all-1g.18gb (56 slices), 3 slices of each GPU under load.
    Returns the global flags, the environment and the slices' MIG UUIDs."""
    state = tmp / "node.json"
    prefix = ["--simulate", "h200x8", "--sim-state", str(state)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    cfg = tmp / "mig.yaml"
    cfg.write_text(
        subprocess.run(
            _nodeagent(*prefix, "mig", "generate-config"),
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    )
    subprocess.run(
        _nodeagent(*prefix, "mig", "apply", "-f", str(cfg), "-c", "all-1g.18gb"),
        check=True,
        capture_output=True,
        env=env,
    )
    status = json.loads(
        subprocess.run(
            _nodeagent(*prefix, "status", "-o", "json"),
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    )
    pid = 2000
    for gpu in status["gpus"]:
        for s in gpu["slices"][:3]:
            subprocess.run(
                _nodeagent(
                    *prefix,
                    "sim",
                    "attach",
                    "--device",
                    s["mig_uuid"],
                    "--pid",
                    str(pid),
                    "--memory-mib",
                    "4096",
                    "--load",
                    "0.6",
                ),
                check=True,
                capture_output=True,
                env=env,
            )
            pid += 1
    uuids = [s["mig_uuid"] for g in status["gpus"] for s in g["slices"]]
    assert len(uuids) == 56, uuids
    return prefix, env, uuids


@contextmanager
def kube(
    tmp: Path, uuids: list[str], env: dict[str, str], dra: bool = False
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """What `nodeagent run --kube` needs, on loopback: an API server (kmock, as the tests use)
    with this Node, and the kubelet's pod-resources socket (the tests' fake) listing one pod on
    each slice; with `dra`, an API server that knows resource.k8s.io/v1 and `--dra` with its
    plugin, registry and CDI directories in `tmp`. Yields the `run` flags and the environment."""
    if importlib.util.find_spec("kmock") is None:  # the conftest would skip, not raise
        raise ImportError("kmock (the `test` extra) is not installed")
    root = str(Path(__file__).resolve().parents[1])  # the tests' helpers, from this checkout
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.support.cluster import Cluster
    from tests.support.dra import dra_cluster
    from tests.support.fake_kubelet.podresources import pod, serve

    cluster = dra_cluster() if dra else Cluster()
    socket = tmp / "kubelet.sock"
    flags = ["--kube", "--kube-host", cluster.url, "--pod-resources-socket", str(socket)]
    if dra:
        for d in ("plugins", "registry", "cdi"):
            (tmp / d).mkdir()
            flags += [f"--dra-{d.rstrip('s')}-dir", str(tmp / d)]
        flags.append("--dra")
    try:
        cluster.add_node("bench-node", {})
        with serve(socket) as kubelet:
            kubelet.pods = [  # type: ignore[assignment]
                pod("bench", f"infer-{i}", {"main": {"nvidia.com/mig-1g.18gb": [uuid]}})
                for i, uuid in enumerate(uuids)
            ]
            yield flags, {**env, "NODE_NAME": "bench-node"}
    finally:
        cluster.close()


def idle_cpu(
    prefix: list[str], env: dict[str, str], seconds: float, cwd: Path | None = None
) -> Row:
    """The agent's own cost when nothing happens: CPU seconds over `seconds` with no scrape,
    then over `seconds` with one scrape every 15 s (Prometheus' usual interval), after a
    warm-up of 10 s (the first reconcile, two GPM samples)."""
    proc, port = _start_agent(prefix, env, cwd=cwd)
    try:
        time.sleep(10)
        cpu0, t0, woken = _cpu_seconds(proc.pid), time.monotonic(), _wakeups(proc.pid)
        time.sleep(seconds)
        quiet = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        wakeups = (_wakeups(proc.pid) - woken) / (time.monotonic() - t0)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        due, scrapes = t0, 0
        while (left := t0 + seconds - time.monotonic()) > 0:
            if time.monotonic() >= due:
                _scrape(port, 1)
                scrapes, due = scrapes + 1, due + 15
            time.sleep(min(left, max(due - time.monotonic(), 0)))
        scraped = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "seconds": seconds,
        "quiet": quiet,
        "scraped": scraped,
        "scrapes": scrapes,
        "wakeups": wakeups,
    }


def nvidia_smi(n: int) -> dict[str, object] | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            [binary, f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader"],
            check=True,
            capture_output=True,
        )
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return {
        "p50": statistics.median(lat) * 1e3,
        "p99": lat[int(0.99 * len(lat)) - 1] * 1e3,
        "max": lat[-1] * 1e3,
    }


# (scrapers, seconds between one scraper's scrapes; 0: back to back)
# (scrapers, period s (0: back to back), "procs": a process each | "mux": one client process)
SWEEP = ((1, 0.0, "procs"), (4, 0.0, "procs"), (16, 0.0, "procs"), (16, 0.1, "procs"),
         (16, 0.1, "mux"), (16, 0.015, "mux"))  # fmt: skip


def main() -> None:
    print(
        "an agent on an emulated 8 x H200 node, scraped 1000 times, then with --kube (a few minutes) ...",
        file=sys.stderr,
        flush=True,
    )
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=1000, help="per row and per sweep level")
    parser.add_argument("--smi-runs", type=int, default=100)
    parser.add_argument("--skip-emulated", action="store_true")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window")
    parser.add_argument("--only-idle", action="store_true", help="the idle CPU table alone")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure the idle cost of git revision REV's agent, runs alternating with "
        "this checkout's (before/after on the same machine and load)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="idle runs per agent")
    parser.add_argument("--plot", default="metrics-sweep.png", help="(with matplotlib)")
    parser.add_argument("--idle-plot", default="metrics-idle.png", help="(with matplotlib)")
    parser.add_argument(
        "--agent-python",
        help="the Python that runs the agent (default: this one). RSS depends on what is "
        "installed: a venv with the test tools makes structlog import rich (~5 MiB); "
        "`python3 -m venv V && V/bin/pip install .` is the agent as the image ships it",
    )
    args = parser.parse_args()
    if args.agent_python:
        AGENT_PYTHON[:] = [args.agent_python]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only_idle:
            prefix, env, _ = emulated_node(Path(tmp))
            idle = idle_runs(prefix, env, args, Path(tmp))
            print_idle(idle)
            plot_idle(idle, args.idle_plot)
            return
        if not args.skip_emulated:
            prefix, env, uuids = emulated_node(Path(tmp))
            idle = idle_runs(prefix, env, args, Path(tmp))
            rows.append(measure("emulated 56 slices", prefix, env, args.scrapes))
            try:
                with kube(Path(tmp), uuids, env) as (flags, kenv):
                    rows.append(
                        measure(
                            "emulated 56 slices, 56 pods, --kube",
                            prefix,
                            kenv,
                            args.scrapes,
                            SWEEP,
                            tuple(flags),
                        )
                    )
            except ImportError as err:  # kmock or grpc missing: the `test` extra
                print(f"(no --kube row: {err})", file=sys.stderr)
        smi = None
        if shutil.which("nvidia-smi"):
            env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
            count = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True
            ).stdout.count("GPU ")
            rows.append(measure(f"real NVML, {count} GPU", [], env, args.scrapes, SWEEP))
            smi = nvidia_smi(args.smi_runs)
    print(
        f"/metrics over loopback HTTP, {args.scrapes} scrapes from one keep-alive client"
        " (agent = a `nodeagent run` process; RSS after warm-up / after all scrapes)"
    )
    head = (
        f"{'target':<38}{'series':>7}{'pods':>5}{'bytes':>7}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'max ms':>8}{'CPU ms/scrape':>14}{'RSS MiB':>13}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['label']:<38}{r['series']:>7}{r['pods']:>5}{r['bytes']:>7}{r['p50']:>8.2f}"
            f"{r['p99']:>8.2f}{r['max']:>8.2f}{r['cpu']:>14.3f}"
            f"{r['rss']:>7.1f}/{r['rss_after']:<5.1f}"
        )
    if smi:
        print(
            f"{'nvidia-smi --query-gpu (same fields)':<38}{'':>19}{smi['p50']:>8.2f}"
            f"{smi['p99']:>8.2f}{smi['max']:>8.2f}   ({args.smi_runs} runs)"
        )
    if not args.skip_emulated:
        print_idle(idle)
        plot_idle(idle, args.idle_plot)
    swept = [r for r in rows if r["sweep"]]
    if swept:
        print(
            f"\nconcurrent scrapers (keep-alive), {args.scrapes} scrapes in"
            " all per level; every: back to back (closed loop, the next scrape as soon as the"
            " answer is read) or one scrape per scraper every N ms, random phases; client:"
            " a process per scraper, or all scrapers' connections in one process (latency from"
            f" when the scrape was due); {os.cpu_count()} CPUs shared by the agent and the"
            " scrapers"
        )
        head = (
            f"{'target':<38}{'scrapers':>9}{'every':>8}{'client':>11}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'max ms':>8}{'scrapes/s':>10}{'CPU ms/scrape':>14}"
        )
        print(head)
        print("-" * len(head))
        for r in swept:
            for level in r["sweep"]:
                print(
                    f"{r['label']:<38}{level['scrapers']:>9}"
                    f"{_every(level['period']):>8}{level['client']:>11}{level['p50']:>8.2f}"
                    f"{level['p99']:>8.2f}{level['max']:>8.2f}{level['rate']:>10.0f}"
                    f"{level['cpu']:>14.3f}"
                )
        plot(swept, args.plot)


def idle_runs(
    prefix: list[str], env: dict[str, str], args: argparse.Namespace, tmp: Path
) -> dict[str, list[Row]]:
    """The idle cost of this checkout's agent (and of --baseline REV's: its `nodeagent`
    package exported from git, run from that folder so that `-m nodeagent` imports it),
    `--repeat` runs each, alternating. Where a driver is present (the GPU machine), each
    agent also on the real GPUs (rows "..., real NVML")."""
    agents: dict[str, Path | None] = {"this checkout": None}
    if args.baseline:
        root = Path(__file__).resolve().parents[1]
        base = tmp / "baseline"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", args.baseline, "nodeagent"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        where = subprocess.run(
            [*AGENT_PYTHON, "-c", "import nodeagent; print(nodeagent.__file__)"],
            cwd=base, env=env, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        assert where.startswith(str(base)), f"the baseline agent would import {where}"
        agents = {args.baseline: base, **agents}
    nodes = {"": prefix}
    if shutil.which("nvidia-smi"):
        nodes[", real NVML"] = []
    runs: dict[str, list[Row]] = {name + n: [] for n in nodes for name in agents}
    for _ in range(max(args.repeat, 1)):
        for node, flags in nodes.items():
            for name, cwd in agents.items():
                runs[name + node].append(idle_cpu(flags, env, args.idle_seconds, cwd))
    return runs


def print_idle(runs: dict[str, list[Row]]) -> None:
    first = next(iter(runs.values()))[0]
    print(f"\nidle agent, emulated 56 slices (or the real GPUs), default intervals: CPU over {first['seconds']:.0f} s"
          " as a share of one core (target <= 0.5 %); median (min-max) of the runs")  # fmt: skip
    head = (
        f"{'agent':<36}{'runs':>5}{'no scrape':>20}{'one scrape every 15 s':>24}{'wake-ups/s':>12}"
    )
    print(head)
    print("-" * len(head))
    for name, rows in runs.items():
        cells = [_spread([r[key] * 100 for r in rows]) for key in ("quiet", "scraped")]
        woken = statistics.median(r["wakeups"] for r in rows)
        print(f"{name:<36}{len(rows):>5}{cells[0]:>20}{cells[1]:>24}{woken:>12.1f}")
    print("(wake-ups/s: the agent's threads woken per second with no scrape)")


def plot_idle(runs: dict[str, list[Row]], path: str) -> None:
    """The idle table as bars (median, min-max whiskers) against the target, if matplotlib
    (the `bench` extra) is importable."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(runs)
    for i, (name, rows) in enumerate(runs.items()):
        for x, key in enumerate(("quiet", "scraped")):
            values = [r[key] * 100 for r in rows]
            mid = statistics.median(values)
            ax.bar(
                x + i * width, mid, width,
                yerr=[[mid - min(values)], [max(values) - mid]], capsize=3,
                color=f"C{i}", label=name if x == 0 else None,
            )  # fmt: skip
    ax.axhline(0.5, color="red", linestyle="--", linewidth=1, label="target 0.5 %")
    middle = (len(runs) - 1) * width / 2
    ax.set_xticks([middle, 1 + middle], ["no scrape", "one scrape every 15 s"])
    ax.set_ylabel("% of one core")
    ax.set_title("idle agent, default intervals (emulated: 56 slices)", fontsize=9)
    _save(fig, ax, path)


def _pyplot() -> Any:
    """matplotlib's pyplot (off-screen), or None without the `bench` extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(fig: Any, ax: Any, path: str) -> None:
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} % ({min(values):.2f}-{max(values):.2f})"


def _every(period: float) -> str:
    return f"{period * 1e3:.0f} ms" if period else "b2b"


def plot(rows: list[Row], path: str) -> None:
    """p50/p99 per concurrency level, if matplotlib (the `bench` extra) is importable."""
    plt = _pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        closed = [x for x in r["sweep"] if not x["period"]]
        levels = [x["scrapers"] for x in closed]
        for key, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(levels, [x[key] for x in closed], style, label=f"{r['label']} {key}")
    ax.set_xlabel("concurrent scrapers, back to back")
    ax.set_ylabel("ms per scrape")
    ax.set_xscale("log", base=2)
    _save(fig, ax, path)


if __name__ == "__main__":
    main()
