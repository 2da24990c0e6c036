"""Emulator state-file benchmark: `mig apply` time against the number of emulated GPUs.

Every mutating NVML call of the emulator is written to its state file (`--sim-state`), so
that separate processes see it. For 8, 16, 32 and 64 emulated H200s with a state file in a
fresh temporary folder, this applies `all-1g.18gb` (MIG on, 7 GIs and 7 CIs per GPU: 15
mutations per GPU) in this process and prints wall time, CPU time and time per mutation. A
cost per mutation that grows with the GPU count means the apply is quadratic.

`--json PATH` saves the rows; `--before PATH` (rows saved by a run of older code, e.g. with
PYTHONPATH pointing at an exported older tree) adds them to the table and the plot, written
to benchmarks/simstate.png (matplotlib, the `bench` extra) or --plot PATH. Never fails on time.

Run: python benchmarks/simstate.py [--sizes 8,16,32,64] [--json P] [--before P] [--plot P]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nodeagent.base.logs import configure_logging
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml

# the MIG change through the one pipeline, as the tests make it (tests/support/mig_apply.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.mig_apply import reconfigure

Row = dict[str, float]


def measure(gpus: int, repeat: int) -> Row:
    """Median wall and CPU seconds of applying all-1g.18gb to `gpus` fresh H200s."""
    walls: list[float] = []
    cpus: list[float] = []
    mutations = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            lib = SimulatedNvml(["h200"] * gpus, Path(folder) / "node.json")
            session = NvmlSession(lib)
            cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "gen")
            before = lib.faults.mutations
            wall, cpu = time.perf_counter(), time.process_time()
            reconfigure(session, cfg, "all-1g.18gb", lib.reset)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            mutations = lib.faults.mutations - before
    wall_s, cpu_s = statistics.median(walls), statistics.median(cpus)
    return {"gpus": gpus, "mutations": mutations, "wall_s": wall_s, "cpu_s": cpu_s,
            "ms_per_mutation": wall_s * 1000 / mutations}  # fmt: skip


def main() -> int:
    print(
        "applying configs on emulated nodes of growing size (a row as each finishes) ...",
        file=sys.stderr,
        flush=True,
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="save the rows here")
    parser.add_argument("--before", help="rows saved by a run of older code")
    parser.add_argument("--plot", default=str(Path(__file__).with_name("simstate.png")))
    args = parser.parse_args()
    configure_logging("warning")
    rows = [measure(int(n), args.repeat) for n in args.sizes.split(",")]
    before = (
        {int(r["gpus"]): r for r in json.loads(Path(args.before).read_text())}
        if args.before
        else {}
    )
    print("mig apply all-1g.18gb on N emulated H200s with a state file (median of"
          f" {args.repeat}; wall s, CPU s, wall ms per mutation)\n")  # fmt: skip
    head = f"{'GPUs':>5}{'mutations':>10}{'wall s':>9}{'CPU s':>8}{'ms/mut':>8}"
    if before:
        head += f"{'before wall s':>15}{'CPU s':>8}{'ms/mut':>8}{'speed-up':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = (f"{r['gpus']:>5.0f}{r['mutations']:>10.0f}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}"
                f"{r['ms_per_mutation']:>8.2f}")  # fmt: skip
        b = before.get(int(r["gpus"]))
        if b:
            line += (f"{b['wall_s']:>15.2f}{b['cpu_s']:>8.2f}{b['ms_per_mutation']:>8.2f}"
                     f"{b['wall_s'] / r['wall_s']:>9.1f}x")  # fmt: skip
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    plot(rows, list(before.values()), args.plot)
    return 0


def plot(rows: list[Row], before: list[Row], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, series, style in (("before", before, "o--"), ("now", rows, "o-")):
        if series:
            ax.plot([r["gpus"] for r in series], [r["wall_s"] for r in series], style, label=label)
    ax.set_xlabel("emulated H200s")
    ax.set_ylabel("mig apply all-1g.18gb, wall s")
    ax.set_xticks([r["gpus"] for r in rows])
    ax.set_title("emulator state file: apply time vs GPU count", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
