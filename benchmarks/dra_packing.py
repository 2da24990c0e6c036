"""How well the scheduler's first fit packs MIG claims, by the order the driver publishes its
devices in.

kube-scheduler takes, for each request, the first device in slice order that matches and whose
counters fit (nodeagent.dra.firstfit models it on the ResourceSlices nodeagent publishes). This
replays arrive/depart events of mixed MIG profiles on emulated H200s through that model for
three orders of each GPU's devices:

- nodeagent:  nodeagent.dra.devices (the order it publishes now)
- previous:   the order before it: the whole GPU, then profiles largest first, each profile's
              placements by start (lowest first)
- nvidia:     NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu@95932046683719c4,
              cmd/gpu-kubelet-plugin/driver.go, generateSharedCounterResourceSlices: per GPU in
              PCI bus order, devices sorted by name: the whole GPU, then profiles by name
              (1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, ...), placements by start)

The node's GPUs come in index order (one slice per GPU), as nodeagent names its slices.

A fragmentation failure is an arrival that finds no device while the node has, in total, at
least as many free memory slices as the profile needs; the target is <= 1 % of arrivals. Load:
an arrival comes with probability 0.6 while the node's memory slices are less than --load
used, else 0.3; a departure takes a random live claim.

Run: python benchmarks/dra_packing.py [--events 20000] [--gpus 8] [--seed 1] [--plot PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodeagent.dra import devices as devmod
from nodeagent.dra.devices import SliceSpec, gpu_device, mig_device, offers_slices
from nodeagent.dra.firstfit import FirstFit, profile_is, whole_gpu
from nodeagent.mig.geometry import Geometry
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import Gpu, Inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec

# The mix: (request, weight, memory slices). "gpu" is a whole GPU.
MIX = (
    ("1g.18gb", 0.40, 1),
    ("1g.35gb", 0.10, 2),
    ("2g.35gb", 0.20, 2),
    ("3g.71gb", 0.15, 4),
    ("4g.71gb", 0.07, 4),
    ("gpu", 0.08, 8),
)


def previous_order(inventory: Inventory, gpu: Gpu) -> list[dict[str, Any]]:
    """The order nodeagent published before (kept here to compare)."""
    out = [gpu_device(inventory, gpu)]
    if offers_slices(gpu):
        for p in sorted(gpu.profiles, key=lambda p: (-p.slice_count, -p.memory_bytes, p.id)):
            out += [mig_device(inventory, gpu, p, at) for at in p.placements]
    return out


def nvidia_order(inventory: Inventory, gpu: Gpu) -> list[dict[str, Any]]:
    return sorted(previous_order(inventory, gpu), key=lambda d: str(d["name"]))


ORDERS: dict[str, Callable[[Inventory, Gpu], list[dict[str, Any]]]] = {
    "nodeagent": devmod.gpu_devices,
    "previous": previous_order,
    "nvidia": nvidia_order,
}


def slices_in(
    inventory: Inventory, order: Callable[[Inventory, Gpu], list[dict[str, Any]]]
) -> list[SliceSpec]:
    """nodeagent's ResourceSlices with each GPU's devices in `order`."""
    specs = devmod.resource_slices(inventory, "node", "gpu.nodeagent.io")
    gpus = {f"node-gpu-nodeagent-io-gpu-{g.index}": g for g in inventory.gpus}
    out = []
    for s in specs:
        gpu = gpus.get(s.name)
        if gpu is None:
            out.append(s)
            continue
        out.append(replace(s, spec={**s.spec, "devices": order(inventory, gpu)}))
    return out


@dataclass
class Result:
    order: str
    load: float
    arrivals: int = 0
    placed: int = 0
    failures: int = 0
    fragmentation: int = 0
    avoidable: int = 0
    used_slices_sum: float = 0.0
    events: int = 0

    @property
    def fragmentation_pct(self) -> float:
        return 100.0 * self.fragmentation / max(1, self.arrivals)

    @property
    def avoidable_pct(self) -> float:
        return 100.0 * self.avoidable / max(1, self.arrivals)

    @property
    def mean_load(self) -> float:
        return self.used_slices_sum / max(1, self.events)


def replay(inventory: Inventory, order: str, events: int, seed: int, load: float) -> Result:
    rng = random.Random(seed)
    model = FirstFit(slices_in(inventory, ORDERS[order]))
    total = 8 * len(inventory.gpus)
    used = 0
    live: list[tuple[str, int, int, str]] = []
    geometry = {g.index: Geometry.of(g) for g in inventory.gpus}
    ids = {p.name: p.id for p in inventory.gpus[0].profiles}
    held: dict[int, list[int]] = {g.index: [] for g in inventory.gpus}  # profile ids per GPU
    whole_held = {g.index: False for g in inventory.gpus}
    result = Result(order, load)
    names, weights = [m[0] for m in MIX], [m[1] for m in MIX]
    sizes = {m[0]: m[2] for m in MIX}
    for _ in range(events):
        arrive = rng.random() < (0.6 if used < load * total else 0.3)
        if arrive or not live:
            want = rng.choices(names, weights)[0]
            result.arrivals += 1
            match = whole_gpu if want == "gpu" else profile_is(want)
            got = model.allocate(match)
            if got is None:
                result.failures += 1
                if total - used >= sizes[want]:
                    result.fragmentation += 1
                if want != "gpu" and any(
                    geometry[g].fits_counts(Counter([*held[g], ids[want]]))
                    for g in held
                    if not whole_held[g]
                ):
                    result.avoidable += 1
            else:
                result.placed += 1
                gpu = model.device(got).gpu
                live.append((got, sizes[want], gpu, want))
                used += sizes[want]
                if want == "gpu":
                    whole_held[gpu] = True
                else:
                    held[gpu].append(ids[want])
        else:
            name, size, gpu, what = live.pop(rng.randrange(len(live)))
            model.release(name)
            used -= size
            if what == "gpu":
                whole_held[gpu] = False
            else:
                held[gpu].remove(ids[what])
        result.events += 1
        result.used_slices_sum += used / total
    return result


def merged(runs: list[Result]) -> Result:
    out = Result(runs[0].order, runs[0].load)
    for r in runs:
        out.arrivals += r.arrivals
        out.placed += r.placed
        out.failures += r.failures
        out.fragmentation += r.fragmentation
        out.avoidable += r.avoidable
        out.used_slices_sum += r.used_slices_sum
        out.events += r.events
    return out


def seven_ones(inventory: Inventory, order: str) -> int:
    """How many 1g.18gb claims one H200 takes."""
    one = replace(inventory, gpus=inventory.gpus[:1])
    model = FirstFit(slices_in(one, ORDERS[order]))
    n = 0
    while model.allocate(profile_is("1g.18gb")) is not None:
        n += 1
    return n


def the_case(inventory: Inventory, order: str) -> int:
    """3g, 2g, 1g, 1g on one H200: how many fit."""
    one = replace(inventory, gpus=inventory.gpus[:1])
    model = FirstFit(slices_in(one, ORDERS[order]))
    return sum(
        model.allocate(profile_is(p)) is not None
        for p in ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=5, help="runs per cell (seeds seed, seed+1, ...)")
    ap.add_argument("--loads", default="0.6,0.75,0.9")
    ap.add_argument("--plot", type=Path, default=Path(__file__).with_name("dra-packing.png"))
    args = ap.parse_args()
    inventory = read_inventory(NvmlSession(SimulatedNvml(parse_spec(f"h200x{args.gpus}"))))
    loads = [float(x) for x in args.loads.split(",")]
    began = time.monotonic()
    print(
        f"{args.gpus} emulated H200s, {args.events} events per run, seed {args.seed}; mix: "
        + ", ".join(f"{n} {w:.0%}" for n, w, _ in MIX)
    )
    print()
    print(
        f"{'order':<10} {'7x1g/H200':>9} {'3g+2g+1g+1g':>11}  "
        + "  ".join(f"{'load < ' + format(x, '.0%'):>29}" for x in loads)
    )
    print(
        f"{'':<10} {'':>9} {'':>11}  "
        + "  ".join(f"{'used   fail  fragm. avoid.':>29}" for _ in loads)
    )
    results: dict[str, list[Result]] = {}
    for order in ORDERS:
        rows = [
            merged(
                [replay(inventory, order, args.events, args.seed + k, x) for k in range(args.seeds)]
            )
            for x in loads
        ]
        results[order] = rows
        cells = "  ".join(
            f"{r.mean_load:>6.0%} {100 * r.failures / r.arrivals:>5.1f}% {r.fragmentation_pct:>6.2f}% {r.avoidable_pct:>5.2f}%"
            for r in rows
        )
        print(
            f"{order:<10} {seven_ones(inventory, order):>9} {the_case(inventory, order):>11}  {cells}"
        )
    print()
    print(
        f"{args.seeds} runs of {args.events} events each (seeds {args.seed}..{args.seed + args.seeds - 1}) per cell."
        " used: mean share of the node's memory slices held; fail: arrivals no device took;"
        " fragm.: failures while the node had enough free memory slices in total;"
        " avoid.: failures where some GPU could have held the claim beside its claims, placed otherwise."
    )
    print(f"took {time.monotonic() - began:.1f} s")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (the bench extra): no plot")
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.25
    for k, (order, rows) in enumerate(results.items()):
        ax.bar(
            [i + k * width for i in range(len(loads))],
            [r.fragmentation_pct for r in rows],
            width,
            label=f"{order}: fragm.",
        )
        ax.scatter(
            [i + k * width for i in range(len(loads))],
            [r.avoidable_pct for r in rows],
            color="black",
            marker="_",
            s=200,
            zorder=3,
            label="avoidable" if k == 0 else None,
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="target 1 %")
    ax.set_xticks([i + width for i in range(len(loads))], [f"load < {x:.0%}" for x in loads])
    ax.set_ylabel("fragmentation failures, % of arrivals")
    ax.set_title(
        f"First fit over the published order: {args.gpus} H200s, {args.seeds} x {args.events} events"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
