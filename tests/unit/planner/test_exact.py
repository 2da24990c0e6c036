"""The planner's search is exact: equal to an exhaustive search written independently.

Two levels. Per GPU: every (vector of replicas -> most existing slices kept) the planner finds
equals what every valid layout (tests/mig_support's own hardware rules) with every assignment of
replicas to its slices gives, and the MPS and whole-GPU options equal a plain enumeration. Per
node: the objective the search reaches equals the best over every combination of per-GPU options
and every MPS client count from 2 up, on small nodes of mixed models, existing and in-use slices
included (table cases and hypothesis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from itertools import product

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.nvml import Gpu
from nodeagent.planner.options import Demand, GpuView, mig_options, mps_options, whole_options
from nodeagent.planner.search import gpu_options, solve
from tests.support.mig import Candidate, all_valid_layouts, blank_gpu, gpu_with

MIB = 1 << 20
Key = tuple[tuple[int, ...], int, int, int]


def fresh(model: str, index: int = 0) -> Gpu:
    return replace(blank_gpu(model), mig_current=False, mig_pending=False, index=index)


def _fits(d: Demand, memory_mib: int, sms: int, gpu_sms: int) -> bool:
    if d.sms is not None:
        need = d.sms
    elif d.compute is not None:
        need = math.ceil(round(d.compute * gpu_sms, 9))
    else:
        need = 0
    return d.memory_mib <= memory_mib and need <= sms


def _percent(d: Demand, gpu_sms: int) -> int:
    if d.compute is not None:
        return math.ceil(round(d.compute * 100, 9))
    if d.sms is not None:
        return math.ceil(d.sms * 100 / gpu_sms)
    return 0


@cache
def _layouts(gpu: Gpu) -> list[frozenset[Candidate]]:
    return all_valid_layouts(gpu)


def brute_mig(
    gpu: Gpu, demands: tuple[Demand, ...], cap: tuple[int, ...]
) -> dict[tuple[int, ...], int]:
    """vector -> most existing slices kept, over every valid layout and every assignment."""
    profiles = {p.id: p for p in gpu.profiles}
    existing = {(s.profile_id, s.placement.start, s.placement.size): s.in_use for s in gpu.slices}
    busy = {c for c, used in existing.items() if used}
    allowed = {p.id for p in gpu.profiles if "+" not in p.name} | {c[0] for c in existing}
    gpu_sms = max(p.multiprocessor_count for p in gpu.profiles)
    best: dict[tuple[int, ...], int] = {}
    for layout in _layouts(gpu):
        if not busy <= layout or any(c[0] not in allowed for c in layout):
            continue
        kept = len(layout & set(existing))
        slices = sorted(layout)
        choices = []
        for pid, _, _ in slices:
            p = profiles[pid]
            fit = [
                k for k, d in enumerate(demands)
                if d.isolation != "exclusive"
                and _fits(d, p.memory_bytes // MIB, p.multiprocessor_count, gpu_sms)
            ]  # fmt: skip
            choices.append([None, *fit])
        for pick in product(*choices):
            vec = tuple(sum(1 for x in pick if x == k) for k in range(len(demands)))
            if all(a <= c for a, c in zip(vec, cap, strict=False)) and best.get(vec, -1) < kept:
                best[vec] = kept
    return best


def _usable(gpu: Gpu) -> int:
    """MiB an MPS client or a whole-GPU job can have: on a MIG-off GPU without processes, what
    the driver does not hold (its memory used); the total on a MIG GPU (going whole frees it)."""
    return (gpu.memory_total_bytes - (0 if gpu.mig_current else gpu.memory_used_bytes)) // MIB


def brute_mps(
    gpu: Gpu, demands: tuple[Demand, ...], cap: tuple[int, ...], r: int
) -> set[tuple[int, ...]]:
    gpu_sms = max(p.multiprocessor_count for p in gpu.profiles)
    limit = _usable(gpu) // r
    out = set()
    for vec in product(*(range(c + 1) for c in cap)):
        ok = all(
            n == 0 or (d.isolation == "shared" and d.memory_mib <= limit)
            for n, d in zip(vec, demands, strict=False)
        )
        pct = sum(n * _percent(d, gpu_sms) for n, d in zip(vec, demands, strict=False))
        if ok and 1 <= sum(vec) <= r and pct <= 100:
            out.add(vec)
    return out


def brute_whole(
    gpu: Gpu, demands: tuple[Demand, ...], cap: tuple[int, ...]
) -> set[tuple[int, ...]]:
    gpu_sms = max(p.multiprocessor_count for p in gpu.profiles)
    memory = _usable(gpu)
    return {
        tuple(int(i == k) for i in range(len(demands)))
        for k, d in enumerate(demands)
        if cap[k] and d.isolation != "mig" and _fits(d, memory, gpu_sms, gpu_sms)
    }


def D(
    mem_gib: float,
    isolation: str,
    count: int = 1,
    priority: int = 0,
    compute: float | None = None,
    sms: int | None = None,
) -> Demand:
    return Demand(int(mem_gib * 1024), compute, sms, isolation, priority, count)


DEMANDS = {
    "voice": (D(38, "mig"), D(10, "shared", compute=0.1)),
    "small-mig": (D(9, "mig"), D(17, "mig", sms=20)),
    "mixed": (D(30, "shared", compute=0.3), D(5, "mig"), D(60, "exclusive")),
    "tiny": (D(4, "shared"), D(4, "mig", sms=14)),
}
GPUS = {
    "a30": lambda: fresh("a30"),
    "a100-40gb": lambda: fresh("a100-40gb"),
    "h200": lambda: fresh("h200"),
    "h100-idle-slices": lambda: gpu_with("h100-80gb", [(9, 4, 4), (19, 0, 1)]),
    "h200-busy-slice": lambda: gpu_with("h200", [(9, 0, 4), (19, 4, 1), (19, 5, 1)], busy={1}),
}


@pytest.mark.parametrize("gpu_name", list(GPUS))
@pytest.mark.parametrize("demand_name", list(DEMANDS))
def test_per_gpu_options_equal_brute_force(gpu_name: str, demand_name: str) -> None:
    gpu, demands = GPUS[gpu_name](), DEMANDS[demand_name]
    if gpu.memory_slice_count == 8 and len(demands) == 3:
        demands = demands[:2]  # the brute force is (classes + 1) ** 7 per layout
    cap = (3,) * len(demands)
    view = GpuView.of(gpu)
    mine = {vec: o.kept for vec, o in mig_options(view, demands, cap).items()}
    assert mine == brute_mig(gpu, demands, cap)
    assert set(whole_options(view, demands, cap)) == (
        set() if view.busy else brute_whole(gpu, demands, cap)
    )
    for r in (2, 3, 5):
        want = set() if view.busy else brute_mps(gpu, demands, cap, r)
        assert set(mps_options(view, demands, cap, r)) == want


def brute_node(gpus: Sequence[Gpu], demands: tuple[Demand, ...]) -> Key:
    """The best objective over every option of every GPU and every MPS client count."""
    views = [GpuView.of(g) for g in gpus]
    cap = tuple(d.count for d in demands)
    order = sorted({d.priority for d in demands}, reverse=True)
    shared = sum(d.count for d in demands if d.isolation == "shared")
    best: Key | None = None
    for r in [None, *range(2, max(shared, 2) + 3)]:
        tables = []
        for view in views:
            opts = [(vec, o.kept) for vec, o in gpu_options(view, demands, cap, r).items()]
            if not view.busy:
                opts.append((None, 0))  # left whole
            tables.append(opts)
        for combo in product(*tables):
            total = [0] * len(demands)
            used = stranded = kept = 0
            for view, (vec, k) in zip(views, combo, strict=False):
                if vec is None:
                    continue
                used += 1
                kept += k
                stranded += view.memory_mib - sum(
                    n * d.memory_mib for n, d in zip(vec, demands, strict=False)
                )
                total = [a + b for a, b in zip(total, vec, strict=False)]
            if any(a > c for a, c in zip(total, cap, strict=False)):
                continue
            placed = tuple(
                sum(n for n, d in zip(total, demands, strict=False) if d.priority == p)
                for p in order
            )
            key = (placed, -used, -stranded, kept)
            if best is None or key > best:
                best = key
    assert best is not None
    return best


NODES = {
    "2xa30": lambda: [fresh("a30", 0), fresh("a30", 1)],
    "a30+a100": lambda: [fresh("a30", 0), fresh("a100-40gb", 1)],
    "h100-slices+a30": lambda: [
        replace(gpu_with("h100-80gb", [(9, 4, 4), (19, 0, 1)]), index=0),
        fresh("a30", 1),
    ],
    "busy-h200+h100": lambda: [
        replace(gpu_with("h200", [(9, 0, 4), (19, 4, 1)], busy={1}), index=0),
        fresh("h100-80gb", 1),
    ],
}
NODE_DEMANDS = {
    "voice": (D(38, "mig", 2, 1), D(10, "shared", 3, 0, compute=0.3)),
    "prio": (D(20, "mig", 2, 0), D(9, "shared", 2, 1, sms=30), D(70, "exclusive", 1, 2)),
    "tiny": (D(4, "shared", 3), D(5, "mig", 3, 1)),
    "many-small": (D(4, "shared", 6), D(2, "shared", 2, compute=0.2)),
}


@pytest.mark.parametrize("node", list(NODES))
@pytest.mark.parametrize("demand_name", list(NODE_DEMANDS))
def test_search_equals_brute_force(node: str, demand_name: str) -> None:
    gpus, demands = NODES[node](), NODE_DEMANDS[demand_name]
    views = [GpuView.of(g) for g in gpus]
    assert solve(views, demands).objective.key == brute_node(gpus, demands)


MODELS = ["a30", "a100-40gb", "h100-80gb", "h200"]
EXISTING = {  # layouts that exist on the GPU before planning (index into the slices: busy)
    "none": ([], set()),
    "idle": ([(9, 4, 4), (19, 0, 1), (19, 1, 1)], set()),
    "busy": ([(9, 4, 4), (19, 0, 1)], {0}),
}

demand_st = st.builds(
    Demand,
    memory_mib=st.sampled_from([3000, 5000, 9000, 10240, 19000, 30000, 39000, 70000, 100000]),
    compute=st.sampled_from([None, None, 0.1, 0.3, 0.5, 1.0]),
    sms=st.none(),
    isolation=st.sampled_from(["mig", "shared", "exclusive"]),
    priority=st.integers(0, 1),
    count=st.integers(1, 3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=3),
    existing=st.sampled_from(list(EXISTING)),
    demands=st.lists(demand_st, min_size=1, max_size=3),
)
def test_search_equals_brute_force_on_random_mixes(
    models: list[str], existing: str, demands: list[Demand]
) -> None:
    gpus = [fresh(m, i) for i, m in enumerate(models)]
    if models[0] != "a30":  # 8-slot layouts only
        layout, busy = EXISTING[existing]
        if layout:
            gpus[0] = replace(gpu_with(models[0], layout, busy), index=0)
    if len(gpus) == 3 and sum(d.count for d in demands) > 5:
        demands = demands[:1]  # the exhaustive search is the product of three option lists
    views = [GpuView.of(g) for g in gpus]
    mix = tuple(demands)
    assert solve(views, mix).objective.key == brute_node(gpus, mix)
