"""Does NVML attribute SM use to MPS clients? A probe for one real GPU (issue 45, item 2).

Starts a private MPS control daemon (pipe and log directories in a temporary folder), two torch
clients of it with different CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, each running bf16 matmul loops
for a few seconds, and reads through nodeagent's own NVML reads, every half second:

    nvmlDeviceGetProcessUtilization          smUtil per pid (ProcessUtilizationReader)
    nvmlDeviceGetMPSComputeRunningProcesses  the MPS clients and their memory (read_mps_clients)
    nvmlDeviceGetComputeRunningProcesses     every compute process and its memory

It prints one row per pid (the server, each client) and writes the same table as JSON to
--out/mps_attribution.json. The verdict: `clients` when only the clients' pids carry SM use
(nodeagent_dra_share_sm_achieved_percent works on this driver), `server` when only the
server's does, `both` when both do (the metric stays absent: SM use on the server cannot be
split among claims), `none` when no pid does. The daemon is always sent
`quit` at the end, on an error too; no GPU mode or clock is changed. Takes about 20 s.

    python3 benchmarks/mps_attribution.py --out /tmp/probe [--gpu 0] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.nvml.session import gpu_handle, load_real_library, open_session  # noqa: E402
from nodeagent.nvml.utilization import ProcessUtilizationReader, read_mps_clients  # noqa: E402

CLIENT = """
import os, sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
end, n = time.monotonic() + seconds, 0
while time.monotonic() < end:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
    n += 8
print(f"done {n}", flush=True)
"""
PERCENTAGES = (30, 70)
CONTROL_TIMEOUT = 10.0
LIMIT_SECONDS = 55  # the whole probe; past it, it stops (the daemon still quits)


def _too_long(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the probe ran past {LIMIT_SECONDS} s")


def control(env: dict[str, str], line: str) -> str:
    done = subprocess.run(
        ["nvidia-cuda-mps-control"], input=line + "\n", env=env, capture_output=True, text=True,
        timeout=CONTROL_TIMEOUT,
    )  # fmt: skip
    return done.stdout.strip()


@contextmanager
def mps_daemon(gpu: int) -> Iterator[dict[str, str]]:
    """A private control daemon; its environment for clients. Always quit at the end."""
    root = Path(tempfile.mkdtemp(prefix="mps-probe-", dir="/tmp"))  # unix sockets: short path
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": str(gpu),
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }
    for d in ("pipe", "log"):
        (root / d).mkdir()
    try:
        subprocess.run(
            ["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=CONTROL_TIMEOUT
        )
        yield env
    finally:
        try:
            control(env, "quit")
            deadline = time.monotonic() + CONTROL_TIMEOUT
            while (root / "pipe" / "control").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def start_clients(env: dict[str, str], seconds: float) -> list[tuple[int, subprocess.Popen[str]]]:
    clients = []
    for pct in PERCENTAGES:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(seconds)],
            env={**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)},
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        clients.append((pct, proc))
    try:
        for _, proc in clients:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "ready": its context is up, its matrices made
            if not line.startswith("ready"):
                raise RuntimeError(f"client {proc.pid} did not start (exit {proc.poll()})")
    except BaseException:
        for _, proc in clients:
            proc.kill()
            proc.wait()
        raise
    return clients


def sample(gpu: int, seconds: float) -> dict[int, dict[str, Any]]:
    """Every half second for `seconds`: each pid's SM samples and the lists it is in."""
    session = open_session(load_real_library())
    handle = gpu_handle(session, gpu)
    reader = ProcessUtilizationReader(session)
    uuid = str(session.call("nvmlDeviceGetUUID", handle))
    rows: dict[int, dict[str, Any]] = {}

    def row(pid: int) -> dict[str, Any]:
        return rows.setdefault(
            pid, {"sm": [], "compute_mib": None, "mps_mib": None, "in_mps_list": False}
        )

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        for pid, s in (reader.read(gpu, uuid) or {}).items():
            row(pid)["sm"].append(round(s.sm * 100))
        for p in session.read("nvmlDeviceGetComputeRunningProcesses", handle) or []:
            used = p.usedGpuMemory
            row(int(p.pid))["compute_mib"] = None if used is None else int(used) >> 20
        mps = read_mps_clients(session, handle, context=f"GPU {gpu}")
        for pid, used in (mps or {}).items():
            r = row(pid)
            r["in_mps_list"] = True
            r["mps_mib"] = None if used is None else used >> 20
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON table")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=8.0, help="each client's matmul loop")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(LIMIT_SECONDS)
    began = time.monotonic()
    with mps_daemon(args.gpu) as env:
        clients = start_clients(env, args.seconds + 4)
        try:
            servers = [int(x) for x in control(env, "get_server_list").split()]
            rows = sample(args.gpu, args.seconds)
        finally:
            for _, proc in clients:
                try:
                    proc.wait(timeout=max(1.0, LIMIT_SECONDS - (time.monotonic() - began) - 10))
                except (subprocess.TimeoutExpired, TimeoutError):
                    proc.kill()
                    proc.wait()
    roles = {pid: "server" for pid in servers}
    roles.update({proc.pid: f"client {pct} %" for pct, proc in clients})
    table = []
    for pid, r in sorted(rows.items()):
        sm = r["sm"]
        table.append({
            "pid": pid, "role": roles.get(pid, "other"), "sm_samples": len(sm),
            "sm_mean_percent": round(sum(sm) / len(sm), 1) if sm else 0.0,
            "sm_max_percent": max(sm) if sm else 0, "compute_list_mib": r["compute_mib"],
            "mps_list_mib": r["mps_mib"], "in_mps_list": r["in_mps_list"],
        })  # fmt: skip
    on_clients = any(t["sm_max_percent"] > 0 for t in table if t["role"].startswith("client"))
    on_server = any(t["sm_max_percent"] > 0 for t in table if t["role"] == "server")
    verdict = {
        (True, False): "clients", (False, True): "server", (True, True): "both",
        (False, False): "none",
    }[(on_clients, on_server)]  # fmt: skip
    print(f"{'pid':>8} {'role':<13} {'samples':>7} {'sm mean':>8} {'sm max':>7}"
          f" {'compute MiB':>12} {'MPS MiB':>8}")  # fmt: skip
    for t in table:
        print(
            f"{t['pid']:>8} {t['role']:<13} {t['sm_samples']:>7} {t['sm_mean_percent']:>8}"
            f" {t['sm_max_percent']:>7} {t['compute_list_mib']!s:>12} {t['mps_list_mib']!s:>8}"
        )
    print(f"SM use attributed to: {verdict} ({time.monotonic() - began:.1f} s)")
    result = {"gpu": args.gpu, "percentages": list(PERCENTAGES), "verdict": verdict, "rows": table}
    (args.out / "mps_attribution.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
