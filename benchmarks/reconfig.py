"""Reconfiguration benchmark: nodeagent's plan against mig-parted's full teardown.

For every ordered pair (A, B) of generated configs on an emulated 8-GPU node: apply A, then
plan and apply B, with and without a slice in use on every GPU. Prints NVML mutations of
nodeagent's plan vs. the full-teardown baseline (destroy every CI and GI, create every wanted
one, as mig-parted does), and planning time for the whole node. Run: python benchmarks/reconfig.py
"""

from __future__ import annotations

import statistics
import sys
import time
from itertools import product

from nodeagent.base.errors import SliceInUse
from nodeagent.base.logs import configure_logging
from nodeagent.mig import geometry
from nodeagent.mig.apply import execute
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.mig.plan import mismatches, plan
from nodeagent.mig.select import resolve
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec

MIB = 1024 * 1024


def setup(session, cfg, name, reset) -> None:  # type: ignore[no-untyped-def]
    """Bring the node to config `name` (the starting point of a measurement)."""
    inventory = read_inventory(session)
    execute(plan(inventory, resolve(cfg, name, inventory)), MigWriter(session), reset)


def baseline(inventory, desired) -> int:  # type: ignore[no-untyped-def]
    """mig-parted: any difference on a GPU tears it down and rebuilds it."""
    total = 0
    for gpu in inventory.gpus:
        want = desired.get(gpu.index)
        if want is None or not mismatches_one(inventory, gpu.index, want):
            continue
        total += 2 * len(gpu.slices) + 2 * sum(want.counts.values())
        total += int(gpu.mig_current != want.mig_enabled)
    return total


def mismatches_one(inventory, index, want) -> bool:  # type: ignore[no-untyped-def]
    return bool(mismatches(inventory, {index: want}))


def run(spec: str, busy: bool) -> dict[str, object]:
    print(
        f"  {spec}{' with a slice in use on every GPU' if busy else ''}: every ordered pair of configs ...",
        file=sys.stderr,
        flush=True,
    )
    probe = NvmlSession(SimulatedNvml(parse_spec(spec)))
    cfg = parse_config(dump_config(generate_configs(read_inventory(probe))), "generated")
    names = sorted(cfg.configs)
    rows = []
    cold: list[float] = []
    warm: list[float] = []
    for a, b in product(names, names):
        lib = SimulatedNvml(parse_spec(spec))
        session = NvmlSession(lib)
        setup(session, cfg, a, lib.reset)
        if busy:
            for gpu in read_inventory(session).gpus:
                if gpu.slices:
                    lib.attach(gpu.slices[-1].mig_uuid or "", 1000 + gpu.index, MIB)
        inventory = read_inventory(session)
        desired = resolve(cfg, b, inventory)
        geometry._layouts.cache_clear()
        t0 = time.perf_counter()
        try:
            the_plan = plan(inventory, desired)
        except SliceInUse:
            cold.append(time.perf_counter() - t0)
            rows.append((a, b, None, baseline(inventory, desired)))
            continue
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plan(inventory, desired)
        warm.append(time.perf_counter() - t0)
        before = lib.faults.mutations
        execute(the_plan, MigWriter(session), lib.reset)
        done = lib.faults.mutations - before
        assert done == the_plan.mutations
        assert not mismatches(read_inventory(session), desired), (a, b)
        rows.append((a, b, done, baseline(inventory, desired)))
    ok = [r for r in rows if r[2] is not None]
    return {
        "spec": spec,
        "busy": busy,
        "pairs": len(rows),
        "refused": len(rows) - len(ok),
        "ours": sum(r[2] for r in ok),  # type: ignore[misc]
        "base": sum(r[3] for r in ok),
        "fewer": sum(1 for r in ok if r[2] < r[3]),  # type: ignore[operator]
        "equal": sum(1 for r in ok if r[2] == r[3]),
        "more": sum(1 for r in ok if r[2] > r[3]),  # type: ignore[operator]
        "cold_p50": statistics.median(cold) * 1e3,
        "cold_max": max(cold) * 1e3,
        "warm_p50": statistics.median(warm) * 1e3,
        "warm_max": max(warm) * 1e3,
        "rows": rows,
    }


def incremental(spec: str, steps: int = 200, seed: int = 7) -> tuple[int, int, int, int]:
    """An operator's typical change: one GPU gains or loses one slice of one profile.

    A random walk from all-balanced; returns (changes, nodeagent mutations, teardown
    mutations, changes refused because no valid layout exists)."""
    import random

    from nodeagent.mig.select import MigTarget

    rng = random.Random(seed)
    probe = NvmlSession(SimulatedNvml(parse_spec(spec)))
    cfg = parse_config(dump_config(generate_configs(read_inventory(probe))), "generated")
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    setup(session, cfg, "all-balanced", lib.reset)
    ours = base = done_steps = skipped = 0
    while done_steps < steps:
        inventory = read_inventory(session)
        gpu = rng.choice(inventory.gpus)
        counts: dict[int, int] = {}
        for s in gpu.slices:
            counts[s.profile_id] = counts.get(s.profile_id, 0) + 1
        profile = rng.choice(gpu.profiles)
        new = counts.get(profile.id, 0) + rng.choice((-1, 1))
        if new < 0:
            continue
        counts[profile.id] = new
        geo = geometry.Geometry.of(gpu)
        if not geo.fits_counts({k: v for k, v in counts.items() if v}):
            skipped += 1
            continue
        want = {
            gpu.index: MigTarget(gpu.index, True, {k: v for k, v in counts.items() if v}, "walk")
        }
        the_plan = plan(inventory, want)
        execute(the_plan, MigWriter(session), lib.reset)
        ours += the_plan.mutations
        base += baseline(inventory, want)
        done_steps += 1
    return steps, ours, base, skipped


def main() -> None:
    configure_logging("warning")
    results = [run(spec, busy) for spec in ("h200x8", "a100-40gbx8") for busy in (False, True)]
    print(
        "NVML mutations per ordered pair of generated configs (8-GPU node); planning time per node"
    )
    print()
    head = (
        f"{'node':<12}{'in use':<8}{'pairs':>6}{'refused':>8}{'nodeagent':>11}{'teardown':>10}"
        f"{'saved':>7}{'fewer':>7}{'equal':>7}{'more':>6}"
        f"{'plan ms p50':>13}{'max':>8}{'warm p50':>10}{'max':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        saved = 1 - r["ours"] / r["base"] if r["base"] else 0  # type: ignore[operator]
        print(
            f"{r['spec']:<12}{'1/GPU' if r['busy'] else 'none':<8}{r['pairs']:>6}{r['refused']:>8}"
            f"{r['ours']:>11}{r['base']:>10}{saved:>7.0%}"
            f"{r['fewer']:>7}{r['equal']:>7}{r['more']:>6}"
            f"{r['cold_p50']:>13.2f}{r['cold_max']:>8.2f}{r['warm_p50']:>10.2f}{r['warm_max']:>8.2f}"
        )
    print()
    print("incremental changes (one GPU gains or loses one slice; random walk from all-balanced)")
    print(
        f"{'node':<12}{'changes':>8}{'nodeagent':>11}{'teardown':>10}{'saved':>7}"
        f"{'infeasible tried':>18}"
    )
    for spec in ("h200x8", "a100-40gbx8"):
        n, ours, base, skipped = incremental(spec)
        print(f"{spec:<12}{n:>8}{ours:>11}{base:>10}{1 - ours / base:>7.0%}{skipped:>18}")
    print()
    print("selected transitions on h200x8, no slice in use (mutations: nodeagent / teardown)")
    rows = results[0]["rows"]
    pick = [
        ("all-balanced", "all-1g.18gb"),
        ("all-1g.18gb", "all-balanced"),
        ("all-3g.71gb", "all-balanced"),
        ("all-balanced", "all-3g.71gb"),
        ("all-disabled", "all-balanced"),
        ("all-balanced", "all-disabled"),
        ("all-balanced", "all-balanced"),
    ]
    for a, b, ours, base in rows:  # type: ignore[attr-defined]
        if (a, b) in pick:
            print(f"  {a:>14} -> {b:<14} {ours:>4} / {base:<4}")


if __name__ == "__main__":
    main()
