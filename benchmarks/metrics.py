"""Metrics benchmark: scrape latency, agent RSS and CPU per scrape.

1. Emulated 8xH200 node, 7 slices each (56 slices), some under load: 1000 scrapes of a
   `nodeagent run` process over loopback HTTP (keep-alive, as Prometheus scrapes).
2. Where a real NVIDIA driver is present (the GPU machine): the same against the real GPUs,
   and `nvidia-smi --query-gpu=...` for the same fields, in one run.

Run (in the project's .venv): .venv/bin/python benchmarks/metrics.py [--scrapes N]
Prints tables; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NVIDIA_SMI_FIELDS = "index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,mig.mode.current"


def _nodeagent(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodeagent", *args]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


def _start_agent(prefix: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        _nodeagent(*prefix, "run", "--metrics-address", "127.0.0.1:0"),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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
    size = series = 0
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        latencies.append(time.perf_counter() - t0)
        size = len(body)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    conn.close()
    return latencies, size, series


def measure(label: str, prefix: list[str], env: dict[str, str], n: int) -> dict[str, object]:
    proc, port = _start_agent(prefix, env)
    try:
        time.sleep(3)  # samplers warm: inventory read, two GPM samples
        _scrape(port, 20)
        idle0 = _cpu_seconds(proc.pid)
        t0 = time.monotonic()
        time.sleep(2)
        idle_rate = (_cpu_seconds(proc.pid) - idle0) / (time.monotonic() - t0)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        lat, size, series = _scrape(port, n)
        elapsed = time.monotonic() - t0
        cpu = _cpu_seconds(proc.pid) - cpu0 - idle_rate * elapsed
        rss = _rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lat.sort()
    return {
        "label": label,
        "series": series,
        "bytes": size,
        "p50": statistics.median(lat) * 1e3,
        "p99": lat[int(0.99 * len(lat)) - 1] * 1e3,
        "max": lat[-1] * 1e3,
        "cpu": max(cpu, 0.0) / n * 1e3,
        "rss": rss,
    }


def emulated_node(tmp: Path) -> tuple[list[str], dict[str, str]]:
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
    import json

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
    slices = sum(len(g["slices"]) for g in status["gpus"])
    assert slices == 56, slices
    return prefix, env


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--smi-runs", type=int, default=100)
    parser.add_argument("--skip-emulated", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_emulated:
            prefix, env = emulated_node(Path(tmp))
            rows.append(measure("emulated h200x8, 56 slices", prefix, env, args.scrapes))
        smi = None
        if shutil.which("nvidia-smi"):
            env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
            count = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True
            ).stdout.count("GPU ")
            rows.append(measure(f"real NVML, {count} GPU", [], env, args.scrapes))
            smi = nvidia_smi(args.smi_runs)
    print(
        f"/metrics over loopback HTTP, {args.scrapes} scrapes each (agent = a `nodeagent run` process)"
    )
    head = f"{'target':<30}{'series':>8}{'bytes':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'CPU ms/scrape':>15}{'RSS MiB':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['label']:<30}{r['series']:>8}{r['bytes']:>9}{r['p50']:>9.2f}{r['p99']:>9.2f}"
            f"{r['max']:>9.2f}{r['cpu']:>15.3f}{r['rss']:>9.1f}"
        )
    if smi:
        print(
            f"{'nvidia-smi --query-gpu (same fields)':<30}{'':>8}{'':>9}{smi['p50']:>9.2f}{smi['p99']:>9.2f}{smi['max']:>9.2f}"
            f"   ({args.smi_runs} runs)"
        )


if __name__ == "__main__":
    main()
