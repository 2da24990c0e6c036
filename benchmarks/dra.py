"""How long the DRA driver takes to prepare and unprepare a claim, and whether claims on
different GPUs are prepared side by side.

The node side is the agent's own (nodeagent.dra.node.NodeDriver on a reconcile pipeline, as
`nodeagent run --dra` builds it; no gRPC, no API server: the claim object is handed in), so the
figures are the driver's own work: planning, the MIG writer lock, NVML, the MPS daemon, the CDI
spec, the checkpoint and the ownership record.

Emulator (default): an emulated node of 4 H200s with the NVML MIG operations modelled as
blocking calls (the emulator's `h200` latency profile: a MIG mode change 4 s, from
mig-parted's logs on A100s; GPU and compute instance create/destroy ASSUMED, as no published
per-call measurement was found and MIG writes are never made on the lent H200; sources in
nodeagent/sim/latency.py). `--no-latency` measures the driver's own overhead. The MPS daemon
is the project's fake nvidia-cuda-mps-control (tests/support/fake_mps).

- mig: a new 1g.18gb slice (GI + CI) on GPU 0 (MIG already on), then destroyed
- mps: an MPS share (threadPercentage 50, pinnedMemory 16Gi) of GPU 1: its own MPS daemon
- gpu: the whole GPU 2 (MIG off: nothing to change)
- burst: 28 one-slice claims (7 per GPU) on 4 GPUs at once, one thread each (the kubelet's
  calls run side by side): each prepare's time, the longest wait for the MIG writer lock, and
  whether prepares on different GPUs overlapped in time; beside the kubelet's 45 s deadline.

`--real` (the GPU machine): NVIDIA's NVML and the real nvidia-cuda-mps-control, private pipe and
log directories; only an MPS share and a whole GPU (MIG stays off; the run asserts the driver
made no NVML write), and every MPS daemon is quit at the end.

Run: python benchmarks/dra.py [--rounds 50] [--no-latency] [--real] [--plot PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodeagent.agent.factory import dra_driver  # noqa: E402
from nodeagent.dra.claims import ClaimRef  # noqa: E402
from nodeagent.dra.node import NodeConfig, NodeDriver  # noqa: E402
from nodeagent.mig.apply import Done  # noqa: E402
from nodeagent.nvml import MigWriter, NvmlSession  # noqa: E402
from nodeagent.reconcile.claims import ChangeDone, ClaimChange  # noqa: E402
from nodeagent.settings import Settings  # noqa: E402
from nodeagent.sim.latency import PROFILES, parse_latency  # noqa: E402
from tests.support.fake_mps.script import control_script  # noqa: E402

DRIVER = "gpu.nodeagent.io"
NODE = "bench"
# The kubelet's deadline for each NodePrepareResources/NodeUnprepareResources call:
# defaultClientCallTimeout = 45 * time.Second, kubernetes/kubernetes@c4b5de207d1f469249888c498a965c58443e6964
# pkg/kubelet/cm/dra/plugin/dra_plugin.go (a plugin that registers without a timeout gets it).
KUBELET_DEADLINE_SECONDS = 45.0
# Seconds each NVML MIG call blocks: the emulator's `h200` profile (NODEAGENT_SIM_LATENCY=h200),
# whose sources nodeagent/sim/latency.py states: MIG mode from mig-parted's logs, the rest assumed.
LATENCY = parse_latency("h200")


class TimedEngine:
    """The pipeline, with each change's wait for the MIG writer lock recorded."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.waits: list[float] = []
        self.operations: list[Done] = []  # every NVML operation the changes made
        self.lock = threading.Lock()

    def run_change(self, change: ClaimChange) -> ChangeDone:
        done: ChangeDone = self.engine.run_change(change)
        with self.lock:
            self.waits.append(done.lock_wait_seconds)
            self.operations += done.operations
        return done


def make_driver(
    session: NvmlSession, root: Path, mps_control: str
) -> tuple[NodeDriver, TimedEngine]:
    """The agent's node side: NodeDriver on a pipeline of its own, under a MIG writer lock."""
    config = NodeConfig(DRIVER, NODE, root / "p", root / "cdi", mps_control=mps_control)
    node = dra_driver(session, Settings(), config, lambda i: None, root / ".mig.lock")
    timed = TimedEngine(node.engine)
    node.engine = timed
    return node, timed


def claim(name: str, uid: str, device: str, mps: dict[str, Any] | None = None) -> dict[str, Any]:
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device}]
    config = []
    if mps is not None:
        params = {"apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsConfig", **mps}
        config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclasses.dataclass
class Timings:
    kind: str
    prepare: list[float] = dataclasses.field(default_factory=list)
    unprepare: list[float] = dataclasses.field(default_factory=list)

    def row(self) -> dict[str, float]:
        return {
            "prepare_p50_ms": 1000 * pct(self.prepare, 0.5),
            "prepare_p99_ms": 1000 * pct(self.prepare, 0.99),
            "unprepare_p50_ms": 1000 * pct(self.unprepare, 0.5),
            "unprepare_p99_ms": 1000 * pct(self.unprepare, 0.99),
        }


def rounds(
    node: NodeDriver, kind: str, device: str, n: int, mps: dict[str, Any] | None = None
) -> Timings:
    print(f"  {kind}: {n} prepares and unprepares of {device} ...", file=sys.stderr, flush=True)
    out = Timings(kind)
    for i in range(n):
        uid = f"{kind}-{i}"
        began = time.perf_counter()
        node.prepare(ClaimRef("bench", uid, uid), claim(uid, uid, device, mps))
        out.prepare.append(time.perf_counter() - began)
        began = time.perf_counter()
        node.unprepare(uid)
        out.unprepare.append(time.perf_counter() - began)
    return out


def burst(node: NodeDriver, timed: TimedEngine, gpus: int) -> dict[str, Any]:
    """7 one-slice claims per GPU, all at once."""
    print(
        f"  burst: {7 * gpus} one-slice claims on {gpus} GPUs at once ...",
        file=sys.stderr,
        flush=True,
    )
    claims = [(g, p) for p in range(7) for g in range(gpus)]
    spans: dict[str, tuple[int, float, float]] = {}
    errors: list[str] = []
    barrier = threading.Barrier(len(claims))
    timed.waits.clear()

    def go(g: int, p: int) -> None:
        uid = f"burst-{g}-{p}"
        barrier.wait()
        began = time.perf_counter()
        try:
            node.prepare(ClaimRef("bench", uid, uid), claim(uid, uid, f"gpu-{g}-mig-1g18gb-19-{p}"))
        except Exception as err:
            errors.append(f"{uid}: {err}")
        spans[uid] = (g, began, time.perf_counter())

    threads = [threading.Thread(target=go, args=c) for c in claims]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    wall = time.perf_counter() - t0
    overlap = any(
        a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
        for i, a in enumerate(spans.values())
        for b in list(spans.values())[i + 1 :]
    )
    each = [end - start for _, start, end in spans.values()]
    for uid in spans:
        node.unprepare(uid)
    return {
        "claims": len(claims),
        "errors": errors,
        "wall_s": wall,
        "prepare_p50_s": pct(each, 0.5),
        "prepare_max_s": max(each),
        "max_lock_wait_s": max(timed.waits) if timed.waits else 0.0,
        "overlap_across_gpus": overlap,
        "spans": [(g, start - t0, end - t0) for g, start, end in spans.values()],
    }


def quit_daemons(root: Path, control: str) -> None:
    for d in (root / "p" / "mps").glob("*/*"):
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(d / "log"),
        }
        if (d / "pipe" / "control").exists():
            subprocess.run([control], input="quit\n", text=True, env=env, timeout=30, check=False)


def emulator(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from nodeagent.sim import SimulatedNvml
    from nodeagent.sim.models import parse_spec

    lib = SimulatedNvml(parse_spec("h200x4"), root / "sim.json")
    if not args.no_latency:
        lib.latency = LATENCY
    session = NvmlSession(lib)
    writer = MigWriter(session)
    lib.sleep = lambda _seconds: None  # the node as it was before: its mode changes untimed
    for g in (0, 3):
        writer.set_mig_mode(g, True)  # the burst's GPUs 0-3: MIG on where slices are made
    writer.set_mig_mode(1, False)
    lib.sleep = time.sleep
    control = str(control_script(root / "fake" / "daemon"))
    node, timed = make_driver(session, root, control)
    out: dict[str, Any] = {"latency": None if args.no_latency else LATENCY}
    try:
        table = [
            rounds(node, "mig", "gpu-0-mig-1g18gb-19-6", args.rounds),
            rounds(
                node, "mps", "gpu-1", args.rounds, {"threadPercentage": 50, "pinnedMemory": "16Gi"}
            ),
            rounds(node, "gpu", "gpu-2", args.rounds),
        ]
        out["rounds"] = {t.kind: t.row() for t in table}
        lib.sleep = lambda _seconds: None
        for g in (1, 2):
            writer.set_mig_mode(g, True)
        lib.sleep = time.sleep
        out["burst"] = burst(node, timed, 4)
    finally:
        quit_daemons(root, control)
        session.close()
    return out


def real(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import pynvml

    session = NvmlSession(pynvml)
    control = shutil.which("nvidia-cuda-mps-control") or "nvidia-cuda-mps-control"
    node, timed = make_driver(session, root, control)
    try:
        from nodeagent.nvml import read_inventory

        with session.lock:
            gpu = read_inventory(session).gpus[0]
        out: dict[str, Any] = {"gpu": gpu.name, "mig_current": gpu.mig_current}
        if gpu.mig_current:
            out["skipped"] = (
                "GPU 0 has MIG on: a whole-GPU claim would need MIG off (never changed here)"
            )
            return out
        table = [
            rounds(
                node, "mps", "gpu-0", args.rounds, {"threadPercentage": 50, "pinnedMemory": "16Gi"}
            ),
            rounds(node, "gpu", "gpu-0", args.rounds),
        ]
        out["rounds"] = {t.kind: t.row() for t in table}
        out["nvml_writes"] = len(timed.operations)
        assert not timed.operations, f"the driver wrote to NVML on the real GPU: {timed.operations}"
    finally:
        quit_daemons(root, control)
        session.close()
    return out


def show(result: dict[str, Any], where: str) -> None:
    print(f"== {where}")
    if result.get("skipped"):
        print(result["skipped"])
        return
    if "latency" in result:
        lat = result["latency"]
        print(
            "NVML latency model (s; MIG mode from mig-parted's logs, the rest assumed):",
            "none (the driver's overhead)"
            if lat is None
            else ", ".join(f"{op} {v}" for op, v in PROFILES["h200"].items()),
        )
    print(f"{'claim':<6} {'prepare p50':>12} {'p99':>9} {'unprepare p50':>14} {'p99':>9}   (ms)")
    for kind, row in result["rounds"].items():
        print(
            f"{kind:<6} {row['prepare_p50_ms']:>12.1f} {row['prepare_p99_ms']:>9.1f} {row['unprepare_p50_ms']:>14.1f} {row['unprepare_p99_ms']:>9.1f}"
        )
    b = result.get("burst")
    if b:
        print(
            f"burst: {b['claims']} one-slice claims on 4 GPUs at once: all done in {b['wall_s']:.2f} s;"
            f" each prepare p50 {b['prepare_p50_s']:.2f} s, max {b['prepare_max_s']:.2f} s;"
            f" longest MIG writer lock wait {b['max_lock_wait_s']:.2f} s (the kubelet allows {KUBELET_DEADLINE_SECONDS:.0f} s);"
            f" prepares on different GPUs overlapped: {'yes' if b['overlap_across_gpus'] else 'no'};"
            f" errors: {len(b['errors'])}"
        )
        for e in b["errors"][:5]:
            print("  ", e)


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (the bench extra): no plot")
        return
    b = result.get("burst")
    if not b:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, (g, start, end) in enumerate(sorted(b["spans"], key=lambda s: s[1])):
        ax.barh(
            i, end - start, left=start, color=colors[g % 4], label=f"GPU {g}" if i < 4 else None
        )
    ax.set_xlabel("seconds since the burst began")
    ax.set_ylabel("claim")
    ax.set_title("28 one-slice claims on 4 emulated H200s: each prepare's span")
    handles, labels = ax.get_legend_handles_labels()
    by = dict(zip(labels, handles, strict=False))
    ax.legend(by.values(), by.keys())
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--plot", type=Path, default=REPO / "benchmarks" / "dra-burst.png")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    try:
        result = real(args, root) if args.real else emulator(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    show(
        result,
        "H200 (real NVML, real nvidia-cuda-mps-control)" if args.real else "emulated 4 x H200",
    )
    if not args.real:
        plot(result, args.plot)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
