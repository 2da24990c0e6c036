"""Consolidation benchmark (GPU machine): K light inference clients on one GPU.

Modes: one client alone; K together under plain time-slicing; K together under
nodeagent-managed MPS (default active thread percentage 100 // K each). Each client runs a
small fp16 MLP step of fixed shape, one request = one forward pass + synchronize, for a fixed
time after a common start. Prints aggregate requests/s and p50/p99 latency per mode.

Run: python benchmarks/consolidate.py [--clients 4] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLIENT = r"""
import json, os, sys, time, torch
seconds, go = float(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
layers = [torch.randn(1024, 1024, device="cuda", dtype=torch.float16) / 32 for _ in range(4)]
x = torch.randn(32, 1024, device="cuda", dtype=torch.float16)
def step():
    h = x
    for w in layers:
        h = torch.relu(h @ w)
    torch.cuda.synchronize()
for _ in range(200):
    step()
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
lat = []
end = time.perf_counter() + seconds
while True:
    t0 = time.perf_counter()
    if t0 >= end:
        break
    step()
    lat.append(time.perf_counter() - t0)
lat.sort()
print(json.dumps({"n": len(lat), "p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)]}), flush=True)
"""


def run_clients(k: int, seconds: float, env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(seconds), str(go)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(k)
        ]
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"client failed to start: {line!r}")
        go.touch()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 120)
            results.append(json.loads(out.strip().splitlines()[-1]))
    total = sum(r["n"] for r in results)
    return {
        "rps": total / seconds,
        "p50": max(r["p50"] for r in results) * 1e3,
        "p99": max(r["p99"] for r in results) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.settings import MpsSettings, validate
    from nodeagent.nvml import load_real_library, open_session, read_inventory

    base = dict(os.environ)
    rows = {"alone (1 client)": run_clients(1, args.seconds, base)}
    rows[f"time-slicing ({args.clients} clients)"] = run_clients(args.clients, args.seconds, base)
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        raise SystemExit("nvidia-cuda-mps-control not found")
    with tempfile.TemporaryDirectory() as tmp:
        settings = MpsSettings(
            devices=(0,),
            replicas=args.clients,
            pipe_dir=Path(tmp) / "pipe",
            log_dir=Path(tmp) / "log",
            ready_file=Path(tmp) / "ready",
            control_binary=binary,
        )
        daemon = MpsDaemon(
            settings, validate(settings, read_inventory(open_session(load_real_library())))
        )
        status = daemon.start()
        try:
            env = dict(
                base,
                CUDA_MPS_PIPE_DIRECTORY=str(settings.pipe_dir),
                CUDA_MPS_LOG_DIRECTORY=str(settings.log_dir),
            )
            rows[f"MPS {status.thread_percentage:.0f}% each ({args.clients} clients)"] = (
                run_clients(args.clients, args.seconds, env)
            )
        finally:
            daemon.stop()
    solo = rows["alone (1 client)"]
    sliced = rows[f"time-slicing ({args.clients} clients)"]
    print(f"{args.clients} clients, fp16 MLP 4x1024x1024, batch 32, {args.seconds:g} s per mode")
    head = f"{'mode':<32}{'requests/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'vs time-slicing':>17}{'p99 vs alone':>14}"
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        print(
            f"{name:<32}{r['rps']:>12.0f}{r['p50']:>9.3f}{r['p99']:>9.3f}{r['rps'] / sliced['rps']:>16.2f}x{r['p99'] / solo['p99']:>13.2f}x"
        )


if __name__ == "__main__":
    main()
