"""Startup benchmark: how long a one-shot `nodeagent` command takes, against `import pynvml`.

Every command runs as a fresh process on an emulated node (`--simulate h200`), round-robin so
that a slow stretch of the machine hits every command alike, after warm-up runs that fill the
bytecode and page caches. The floor is `python -c "import pynvml"`: nodeagent cannot start
faster than the NVML binding it wraps. Target: `status` within 3x of that floor.

Then `python -X importtime` on `status` lists the modules that cost the most (cumulative, the
median over a few runs) and who imported them: the candidates for a lazy import.

Run (in the project's .venv): .venv/bin/python benchmarks/startup.py [--runs N]
Prints tables and, where matplotlib is installed, writes benchmarks/out/startup.png; never
passes or fails on time. It measures the checkout it lives in (commands run from the repo root).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PLOT = REPO / "benchmarks" / "out" / "startup.png"
TARGET_RATIO = 3.0
BASELINE = "import pynvml"
TARGET = "status"
# Packages whose presence in `status` is worth a line: the ones a lazy import should keep out.
WATCHED = ("kubernetes", "grpc", "google.protobuf", "prometheus_client", "yaml", "structlog")
IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)\s*$")


@dataclass(frozen=True)
class Command:
    label: str
    argv: list[str]


@dataclass(frozen=True)
class Timing:
    label: str
    median_seconds: float
    p90_seconds: float
    min_seconds: float


@dataclass(frozen=True)
class Module:
    name: str
    self_us: float
    cumulative_us: float
    parent: str


def commands(spec: str) -> list[Command]:
    na = [sys.executable, "-m", "nodeagent", "--simulate", spec]
    return [
        Command(BASELINE, [sys.executable, "-c", "import pynvml"]),
        Command("status", [*na, "status"]),
        Command("--help", [*na, "--help"]),
        Command("mig export", [*na, "mig", "export"]),
        Command("labels", [*na, "labels"]),
    ]


def clean_env() -> dict[str, str]:
    """The caller's environment without NODEAGENT_* settings, an inherited importtime flag or
    PYTHONDONTWRITEBYTECODE (an installed nodeagent has its bytecode compiled: without it,
    every run compiles every module it imports, ~50 ms of `status`)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NODEAGENT_")
        and k not in ("PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE")
    }


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one run and its stderr; SystemExit when the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(argv[1:])}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed, proc.stderr


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


def measure(cmds: list[Command], runs: int, warmup: int, env: dict[str, str]) -> list[Timing]:
    samples: dict[str, list[float]] = {c.label: [] for c in cmds}
    for i in range(warmup + runs):
        for c in cmds:
            elapsed, _ = run_once(c.argv, env)
            if i >= warmup:
                samples[c.label].append(elapsed)
    return [Timing(label, statistics.median(s), p90(s), min(s)) for label, s in samples.items()]


def parse_importtime(stderr: str) -> list[Module]:
    """The modules of one `-X importtime` report, each with the module that imported it.

    A module is printed after the modules it imports, one indent level deeper than it, so
    walking the report backwards meets each importer before its imports.
    """
    rows = []
    for line in stderr.splitlines():
        match = IMPORTTIME.match(line)
        if match:
            self_us, cumulative_us, indent, name = match.groups()
            rows.append((len(indent) // 2, name, float(self_us), float(cumulative_us)))
    modules = []
    stack: list[tuple[int, str]] = []
    for level, name, self_us, cumulative_us in reversed(rows):
        while stack and stack[-1][0] >= level:
            stack.pop()
        parent = stack[-1][1] if stack else "-"
        modules.append(Module(name, self_us, cumulative_us, parent))
        stack.append((level, name))
    return modules


def importtime(command: Command, runs: int, env: dict[str, str]) -> list[Module]:
    """Each module of `command` with its median self and cumulative time over `runs` runs."""
    argv = [command.argv[0], "-X", "importtime", *command.argv[1:]]
    reports = [parse_importtime(run_once(argv, env)[1]) for _ in range(runs)]
    by_name: dict[str, list[Module]] = {}
    for report in reports:
        for m in report:
            by_name.setdefault(m.name, []).append(m)
    return [
        Module(
            name,
            statistics.median(m.self_us for m in ms),
            statistics.median(m.cumulative_us for m in ms),
            ms[0].parent,
        )
        for name, ms in by_name.items()
    ]


def print_timings(timings: list[Timing], runs: int, warmup: int) -> float:
    """The table; returns the status/baseline ratio of the medians."""
    base = next(t for t in timings if t.label == BASELINE).median_seconds
    print(f"wall time of a fresh process, {runs} runs each after {warmup} warm-up (round-robin)")
    head = f"{'command':<16}{'median ms':>11}{'p90 ms':>9}{'min ms':>9}{'x ' + BASELINE:>17}"
    print(head)
    print("-" * len(head))
    for t in timings:
        print(
            f"{t.label:<16}{t.median_seconds * 1e3:>11.1f}{t.p90_seconds * 1e3:>9.1f}"
            f"{t.min_seconds * 1e3:>9.1f}{t.median_seconds / base:>17.2f}"
        )
    ratio = next(t for t in timings if t.label == TARGET).median_seconds / base
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(
        f"target: {TARGET} within {TARGET_RATIO:g}x of `{BASELINE}` "
        f"({TARGET_RATIO * base * 1e3:.0f} ms): {ratio:.2f}x, {verdict}"
    )
    return ratio


def print_modules(modules: list[Module], top: int, runs: int) -> None:
    print(
        f"\n`{TARGET}`: {len(modules)} modules imported; the {top} biggest by cumulative time "
        f"(-X importtime, median of {runs} runs)"
    )
    head = f"{'module':<40}{'cumulative ms':>15}{'self ms':>9}  imported by"
    print(head)
    print("-" * (len(head) + 20))
    for m in sorted(modules, key=lambda m: m.cumulative_us, reverse=True)[:top]:
        print(f"{m.name:<40}{m.cumulative_us / 1e3:>15.1f}{m.self_us / 1e3:>9.1f}  {m.parent}")
    print("watched packages (cumulative ms where first imported; imported by):")
    for package in WATCHED:
        inside = {m.name for m in modules if m.name == package or m.name.startswith(package + ".")}
        entries = [m for m in modules if m.name in inside and m.parent not in inside]
        if not entries:
            print(f"  {package:<18} not imported")
            continue
        total_ms = sum(m.cumulative_us for m in entries) / 1e3
        parents = ", ".join(sorted({m.parent for m in entries}))
        print(f"  {package:<18} {total_ms:>6.1f} ms  {parents}")


def plot(timings: list[Timing], path: Path) -> None:
    try:
        # Optional, not a project dependency: the tables are the result, the plot a convenience.
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print(f"\nmatplotlib is not installed in {sys.prefix}: no plot ({path} not written)")
        return
    base = next(t for t in timings if t.label == BASELINE).median_seconds
    labels = [t.label for t in timings]
    medians = [t.median_seconds * 1e3 for t in timings]
    spread = [[0.0] * len(timings), [(t.p90_seconds - t.median_seconds) * 1e3 for t in timings]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(labels, medians, yerr=spread, capsize=4, color="tab:blue")
    ax.axhline(
        TARGET_RATIO * base * 1e3,
        color="tab:red",
        linestyle="--",
        label=f"target: {TARGET_RATIO:g}x {BASELINE}",
    )
    ax.set_ylabel("wall time, ms (median, bar to p90)")
    ax.set_title(f"nodeagent startup ({TARGET} within {TARGET_RATIO:g}x of `{BASELINE}`)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def main() -> None:
    print("timing the commands' start (a row as each finishes) ...", file=sys.stderr, flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per command")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per command first")
    parser.add_argument("--simulate", default="h200", help="emulated node spec")
    parser.add_argument("--importtime-runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=15, help="modules listed from -X importtime")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    args = parser.parse_args()
    env = clean_env()
    cmds = commands(args.simulate)
    print(f"python {sys.version.split()[0]} ({sys.executable}); checkout {REPO}")
    timings = measure(cmds, args.runs, args.warmup, env)
    print_timings(timings, args.runs, args.warmup)
    status = next(c for c in cmds if c.label == TARGET)
    print_modules(importtime(status, args.importtime_runs, env), args.top, args.importtime_runs)
    plot(timings, args.plot)


if __name__ == "__main__":
    main()
