"""Planner benchmark: workloads placed and GPUs used by `nodeagent plan` against two baselines.

On emulated 8-GPU nodes of every model the emulator has (H200, H100, A100 40/80 GB, B200 when
`--simulate b200` loads), for a suite of demand mixes, the consolidation study's voice pipeline
(ASR ~10 GB and TTS ~10 GB beside an 8B LLM needing ~40 GB, i.e. 38 GiB) at several replica
counts among them:

- planner:      `plan_node` (exact search: MIG layouts, MPS shares, whole GPUs);
- all-balanced: mig-parted's `all-balanced` from `nodeagent mig generate-config` on every GPU,
                replicas placed into its fixed slices (highest priority, then largest first,
                each into the smallest free slice that fits);
- first-fit:    a nos-style greedy: replicas in the same order, each into the first GPU where
                the smallest profile that fits it still fits (MIG only; exclusive replicas take
                the first empty GPU whole).

A plan is better when it places more replicas priority level by priority level, then uses
fewer GPUs. Prints one row per (mix, model) and a verdict per baseline, then writes a plot
(matplotlib, the `bench` extra) to benchmarks/planner.png, or --plot PATH. Planning time is
the median CPU time (this process) of --repeat runs. It never fails on time.

Then the exact search's reach: the first k (1..10) workloads of the `ten-kinds` mix on every
model, CPU ms (median of --repeat) and whether the plan is exact. `--json PATH` saves these
times; `--before PATH` (times saved by a run of older code: PYTHONPATH pointing at an
exported older tree) adds them beside, and both go to benchmarks/planner-time.png, or
--time-plot PATH.

Then, per model and node size (`--reach-gpus 8,16`: 16-GPU nodes too), the most kinds
planned exactly within 1 s: the bound stated in the README.

Run: python benchmarks/planner.py [--repeat 5] [--plot PATH] [--json P] [--before P]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nodeagent.base.errors import ConfigError
from nodeagent.mig.generate import balanced
from nodeagent.mig.geometry import Geometry
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import GiProfile, Gpu, Inventory
from nodeagent.planner.planner import plan_node
from nodeagent.planner.workloads import Workload
from nodeagent.sim import SimulatedNvml, parse_spec

GIB = 1 << 30
MIB = 1 << 20
MODELS = ("h200", "h100-80gb", "a100-40gb", "a100-80gb", "b200")


def w(name: str, gib: float, isolation: str, replicas: int, priority: int = 0,
      compute: float | None = None) -> Workload:  # fmt: skip
    return Workload(name, replicas, int(gib * GIB), isolation, priority, compute)


def voice(n: int) -> list[Workload]:
    """The consolidation study's voice pipeline, n of each: the LLM first."""
    return [
        w("llm-8b", 38, "mig", n, priority=1),
        w("asr", 10, "shared", n, compute=0.1),
        w("tts", 10, "shared", n, compute=0.1),
    ]


MIXES: dict[str, list[Workload]] = {
    "voice-2": voice(2),
    "voice-4": voice(4),
    "voice-8": voice(8),
    "voice-12": voice(12),
    "voice-16 (over)": voice(16),
    "embeddings-24": [w("embed", 4, "shared", 24, compute=0.05)],
    "guardrails-20": [w("guard", 9, "mig", 20)],
    "asr-tts-32": [
        w("asr", 10, "shared", 16, compute=0.05),
        w("tts", 10, "shared", 16, compute=0.05),
    ],
    "llm-mix": [
        w("llm-70gb", 70, "mig", 3, priority=2),
        w("llm-8b", 38, "mig", 4, priority=1),
        w("embed", 5, "shared", 12, compute=0.05),
    ],
    "train+serve": [
        w("trainer", 120, "exclusive", 2, priority=2),
        w("llm-8b", 38, "mig", 4, priority=1),
        w("asr", 10, "shared", 10, compute=0.1),
    ],
    "ten-kinds": [
        w("llm-70gb", 70, "mig", 2, priority=2),
        w("llm-8b", 38, "mig", 3, priority=1),
        w("rerank", 20, "mig", 2, priority=1),
        w("guard", 9, "mig", 4),
        w("asr", 10, "shared", 6, compute=0.1),
        w("tts", 10, "shared", 6, compute=0.1),
        w("embed", 4, "shared", 8, compute=0.05),
        w("vad", 2, "shared", 4, compute=0.02),
        w("ocr", 15, "shared", 2, compute=0.2),
        w("trainer", 120, "exclusive", 1, priority=2),
    ],
}


@dataclass(frozen=True)
class Result:
    placed: tuple[int, ...]  # per priority level, highest first
    gpus: int
    seconds: float = 0.0
    exact: bool = True

    @property
    def total(self) -> int:
        return sum(self.placed)

    def key(self) -> tuple[tuple[int, ...], int]:
        return (self.placed, -self.gpus)


def levels(workloads: list[Workload]) -> list[int]:
    return sorted({x.priority for x in workloads}, reverse=True)


def per_level(workloads: list[Workload], placed: dict[str, int]) -> tuple[int, ...]:
    return tuple(
        sum(placed.get(x.name, 0) for x in workloads if x.priority == p) for p in levels(workloads)
    )


def replicas_in_order(workloads: list[Workload]) -> list[Workload]:
    """Highest priority first, then the largest: the order both baselines place in."""
    order = sorted(workloads, key=lambda x: (-x.priority, -x.memory_bytes))
    return [x for x in order for _ in range(x.replicas)]


def _gpu_sms(gpu: Gpu) -> int:
    return max(p.multiprocessor_count for p in gpu.profiles)


def fits(x: Workload, p: GiProfile, gpu: Gpu) -> bool:
    need = -(-round((x.compute or 0) * 10**6) * _gpu_sms(gpu) // 10**6)
    return x.memory_bytes <= p.memory_bytes and need <= p.multiprocessor_count


def all_balanced(inv: Inventory, workloads: list[Workload]) -> Result:
    slices: list[tuple[int, GiProfile]] = []  # (gpu, profile), free slices of all-balanced
    for gpu in inv.gpus:
        for name, n in balanced(gpu).items():
            p = gpu.profile_named(name)
            assert p is not None
            slices += [(gpu.index, p)] * n
    placed: dict[str, int] = {}
    used: set[int] = set()
    for x in replicas_in_order(workloads):
        if x.isolation == "exclusive":
            continue  # every GPU is in MIG mode
        options = [
            (p.memory_bytes, p.multiprocessor_count, i)
            for i, (g, p) in enumerate(slices)
            if fits(x, p, inv.gpus[g])
        ]
        if options:
            i = min(options)[2]
            used.add(slices[i][0])
            slices.pop(i)
            placed[x.name] = placed.get(x.name, 0) + 1
    return Result(per_level(workloads, placed), len(used))


def first_fit(inv: Inventory, workloads: list[Workload]) -> Result:
    counts: list[dict[int, int]] = [{} for _ in inv.gpus]
    whole: set[int] = set()
    placed: dict[str, int] = {}
    for x in replicas_in_order(workloads):
        if x.isolation == "exclusive":
            gpu = next(
                (g for g in inv.gpus
                 if g.index not in whole and not counts[g.index] and x.memory_bytes <= g.memory_total_bytes),
                None,
            )  # fmt: skip
            if gpu is not None:
                whole.add(gpu.index)
                placed[x.name] = placed.get(x.name, 0) + 1
            continue
        for gpu in inv.gpus:
            if gpu.index in whole:
                continue
            plain = [p for p in gpu.profiles if "+" not in p.name and fits(x, p, gpu)]
            if not plain:
                continue
            smallest = min(plain, key=lambda p: (p.memory_bytes, p.multiprocessor_count))
            trial = dict(counts[gpu.index])
            trial[smallest.id] = trial.get(smallest.id, 0) + 1
            if Geometry.of(gpu).fits_counts(trial):
                counts[gpu.index] = trial
                placed[x.name] = placed.get(x.name, 0) + 1
                break
    used = sum(1 for g in inv.gpus if counts[g.index] or g.index in whole)
    return Result(per_level(workloads, placed), used)


def planner(inv: Inventory, workloads: list[Workload], repeat: int) -> Result:
    times = []
    plan = None
    for _ in range(repeat):
        start = time.process_time()
        plan = plan_node(inv, workloads)
        times.append(time.process_time() - start)
    assert plan is not None
    placed: dict[str, int] = {}
    for p in plan.placed:
        placed[p.workload] = placed.get(p.workload, 0) + 1
    return Result(
        per_level(workloads, placed), plan.gpus_used, statistics.median(times), plan.exact
    )


def node(model: str, gpus: int = 8) -> Inventory | None:
    try:
        lib = SimulatedNvml(parse_spec(f"{model}x{gpus}"))
    except ConfigError:
        return None
    session = NvmlSession(lib)
    inv = read_inventory(session)
    session.close()
    return inv


def verdict(mine: Result, theirs: Result) -> str:
    if mine.key() > theirs.key():
        return "better"
    return "equal" if mine.key() == theirs.key() else "WORSE"


def show(r: Result) -> str:
    """Replicas placed per priority level (highest first, joined by +) / GPUs used."""
    return "+".join(str(n) for n in r.placed) + f"/{r.gpus}"


def main() -> int:
    print(
        "planning every mix on every model (a row as each finishes) ...",
        file=sys.stderr,
        flush=True,
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--plot", default=str(Path(__file__).with_name("planner.png")))
    parser.add_argument("--json", help="save the planning times here")
    parser.add_argument("--before", help="planning times saved by a run of older code")
    parser.add_argument("--time-plot", default=str(Path(__file__).with_name("planner-time.png")))
    parser.add_argument("--reach-gpus", default="8", help="node sizes of the reach, e.g. 8,16")
    args = parser.parse_args()
    nodes = {m: inv for m in MODELS if (inv := node(m)) is not None}
    missing = [m for m in MODELS if m not in nodes]
    print(f"models: {', '.join(f'{m}x8' for m in nodes)}"
          + (f" (not in the emulator: {', '.join(missing)})" if missing else ""))  # fmt: skip
    print("cells: replicas placed per priority level, highest first (a+b) / GPUs used (of 8)\n")
    head = f"{'mix':<16} {'model':<10} {'demand':>6} {'planner':>9} {'balanced':>9} {'first-fit':>9}  {'vs balanced':<11} {'vs first-fit':<12} {'CPU ms':>7}"
    print(head)
    print("-" * len(head))
    rows: list[tuple[str, str, Result, Result, Result]] = []
    tally: dict[str, dict[str, int]] = {"balanced": {}, "first-fit": {}}
    for mix, workloads in MIXES.items():
        demand = sum(x.replicas for x in workloads)
        for model, inv in nodes.items():
            mine = planner(inv, workloads, args.repeat)
            bal, ff = all_balanced(inv, workloads), first_fit(inv, workloads)
            vb, vf = verdict(mine, bal), verdict(mine, ff)
            tally["balanced"][vb] = tally["balanced"].get(vb, 0) + 1
            tally["first-fit"][vf] = tally["first-fit"].get(vf, 0) + 1
            rows.append((mix, model, mine, bal, ff))
            print(f"{mix:<16} {model:<10} {demand:>6} {show(mine):>9} {show(bal):>9} {show(ff):>9}"
                  f"  {vb:<11} {vf:<12} {mine.seconds * 1000:>7.1f}")  # fmt: skip
    times = [r[2].seconds * 1000 for r in rows]
    print(f"\nplanning CPU time per 8-GPU node: median {statistics.median(times):.1f} ms,"
          f" max {max(times):.1f} ms over {len(rows)} (mix, model) pairs")  # fmt: skip
    print(f"exact plans: {sum(r[2].exact for r in rows)} of {len(rows)}")
    for name, counts in tally.items():
        print(f"planner vs {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    plot(rows, args.plot)
    times = [
        {"table": "mix", "name": mix, "model": model, "ms": r.seconds * 1000, "exact": r.exact}
        for mix, model, r, _, _ in rows
    ]
    times += reach(nodes, args.repeat, [int(n) for n in args.reach_gpus.split(",")])
    before = json.loads(Path(args.before).read_text()) if args.before else []
    compare(times, before)
    bound(times)
    if before:
        print("before:", end="")
        bound(before)
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=1) + "\n")
    time_plot(times, before, args.time_plot)
    return 0


Time = dict[str, object]


def reach(nodes: dict[str, Inventory], repeat: int, sizes: list[int]) -> list[Time]:
    """The first k workloads of `ten-kinds`, k = 1..10, on every model: on its 8-GPU node,
    and on nodes of the other `sizes` (named model x N) where the emulator makes them."""
    out: list[Time] = []
    ten = MIXES["ten-kinds"]
    for model, inv8 in nodes.items():
        for n in sizes:
            inv = inv8 if n == 8 else node(model, n)
            if inv is None:
                continue
            name = model if n == 8 else f"{model}x{n}"
            for k in range(1, len(ten) + 1):
                r = planner(inv, ten[:k], repeat)
                out.append({"table": "kinds", "name": str(k), "model": name,
                            "ms": r.seconds * 1000, "exact": r.exact})  # fmt: skip
    return out


def bound(times: list[Time], within_ms: float = 1000.0) -> None:
    """Per model (and node size): the most kinds planned exactly within `within_ms`, all
    fewer kinds exact and within it too."""
    print(f"\nexact within {within_ms:.0f} ms: the most kinds k of ten-kinds (every k' <= k too)")
    for model in dict.fromkeys(str(t["model"]) for t in times if t["table"] == "kinds"):
        rows = sorted(
            (int(str(t["name"])), bool(t["exact"]) and float(t["ms"]) <= within_ms)  # type: ignore[arg-type]
            for t in times
            if t["table"] == "kinds" and t["model"] == model
        )
        most = 0
        for k, ok in rows:
            if not ok:
                break
            most = k
        print(f"  {model:<14} {most}")


def compare(times: list[Time], before: list[Time]) -> None:
    old = {(t["table"], t["name"], t["model"]): t for t in before}
    print("\nexact search reach: the first k workloads of ten-kinds (CPU ms, median; * exact)")
    head = f"{'k':>3} {'model':<10} {'now ms':>8}" + (
        f" {'before ms':>10} {'speed-up':>9}" if old else ""
    )
    print(head)
    print("-" * len(head))
    for t in times:
        if t["table"] != "kinds":
            continue
        line = f"{t['name']:>3} {t['model']:<10} {_ms(t):>8}"
        b = old.get(("kinds", t["name"], t["model"]))
        if b:
            line += f" {_ms(b):>10} {float(b['ms']) / max(float(t['ms']), 1e-3):>8.1f}x"  # type: ignore[arg-type]
        print(line)
    for label, rows in (("now", times), ("before", before)):
        mine = [float(t["ms"]) for t in rows if t["table"] == "mix"]  # type: ignore[arg-type]
        if mine:
            exact = sum(bool(t["exact"]) for t in rows if t["table"] == "mix")
            print(f"{label}: benchmark mixes median {statistics.median(mine):.1f} ms, max"
                  f" {max(mine):.1f} ms, exact {exact} of {len(mine)}")  # fmt: skip


def _ms(t: Time) -> str:
    return f"{float(t['ms']):.1f}{'*' if t['exact'] else ' '}"  # type: ignore[arg-type]


def time_plot(times: list[Time], before: list[Time], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    models = list(dict.fromkeys(str(t["model"]) for t in times))
    for label, rows, style in (("before", before, "--"), ("now", times, "-")):
        for i, model in enumerate(models):
            mine = [t for t in rows if t["table"] == "kinds" and t["model"] == model]
            if not mine:
                continue
            xs = [int(str(t["name"])) for t in mine]
            ys = [float(t["ms"]) for t in mine]  # type: ignore[arg-type]
            ax.plot(xs, ys, style, color=f"C{i}", label=f"{model} {label}")
            ax.scatter([x for x, t in zip(xs, mine, strict=True) if t["exact"]],
                       [y for y, t in zip(ys, mine, strict=True) if t["exact"]],
                       color=f"C{i}", s=18)  # fmt: skip
    ax.axhline(100, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("kinds of workloads (the first k of ten-kinds), 8 GPUs")
    ax.set_ylabel("planning CPU ms (dots: exact plans)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def plot(rows: list[tuple[str, str, Result, Result, Result]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return
    models = list(dict.fromkeys(r[1] for r in rows))
    mixes = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 2.8 * len(models)), squeeze=False)
    series: list[tuple[str, Callable[[tuple[str, str, Result, Result, Result]], Result]]] = [
        ("planner", lambda r: r[2]), ("all-balanced", lambda r: r[3]), ("first-fit", lambda r: r[4]),
    ]  # fmt: skip
    width = 0.27
    for ax, model in zip(axes[:, 0], models, strict=True):
        mine = {r[0]: r for r in rows if r[1] == model}
        for i, (label, get) in enumerate(series):
            xs = [j + (i - 1) * width for j in range(len(mixes))]
            vals = [get(mine[m]) for m in mixes]
            bars = ax.bar(
                xs, [v.total for v in vals], width, label=label, color=f"C{i}", alpha=0.45
            )
            top = [v.placed[0] if len(v.placed) > 1 else 0 for v in vals]
            ax.bar(xs, top, width, color=f"C{i}", hatch="//", edgecolor="white")
            for bar, v in zip(bars, vals, strict=True):
                ax.annotate(f"{v.gpus}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_title(
            f"{model} x8: replicas placed, the highest priority hatched (GPUs used above each bar)",
            fontsize=10,
        )
        ax.set_xticks(range(len(mixes)))
        ax.set_xticklabels(mixes, fontsize=8)
        ax.set_ylabel("replicas placed")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
