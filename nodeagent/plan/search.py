"""The exact search: one option per GPU, the best node-wide objective. Pure.

The objective, compared in this order:
  1. replicas placed, priority level by priority level (higher priorities first);
  2. fewer GPUs used (a GPU left whole is free for other work);
  3. less memory stranded: the memory of the used GPUs that placed workloads do not need;
  4. more existing MIG slices kept.
Every term is a sum over GPUs, so a dynamic programme over the GPUs, keyed by the demand still
unplaced, is exact. Each GPU only needs the options no other option of its own beats (more of
every class, as many slices kept), capped by what is left: any optimal plan can be rewritten
into such options without losing on any term (tests/unit/plan prove the search equal to an
exhaustive one). MPS clients per GPU are daemon-wide: every useful count is tried (the counts
where a class stops fitting under memory // replicas, at most 48, the device plugin's limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nodeagent.mps.settings import MAX_PLUGIN_REPLICAS
from nodeagent.plan.options import (
    Demand,
    GpuView,
    Option,
    TooLarge,
    Vec,
    frontier,
    merge,
    mig_greedy,
    mig_options,
    mps_greedy,
    mps_options,
    whole_options,
)


@dataclass(frozen=True)
class Objective:
    placed: tuple[int, ...]  # replicas placed per priority level, highest priority first
    gpus_used: int
    stranded_mib: int
    kept: int

    @property
    def key(self) -> tuple[tuple[int, ...], int, int, int]:
        """Larger is better."""
        return (self.placed, -self.gpus_used, -self.stranded_mib, self.kept)


@dataclass(frozen=True)
class Solution:
    objective: Objective
    options: tuple[Option, ...]  # one per GPU, in the order of the views
    mps_replicas: int | None  # MPS clients per GPU; None: MPS was not an option
    exact: bool = True  # False: the search space was too large; a greedy plan


@dataclass(frozen=True)
class Table:
    """One GPU's options for the search."""

    options: dict[Vec, Option]
    front: tuple[Vec, ...]
    unused: Option | None  # None: the GPU must stay as it is used (slices in use)


def levels(demands: Sequence[Demand]) -> tuple[int, ...]:
    return tuple(sorted({d.priority for d in demands}, reverse=True))


def unused_option(view: GpuView, width: int) -> Option | None:
    return None if view.busy else Option("unused", (0,) * width, 0, view.memory_mib)


def gpu_options(
    view: GpuView, demands: tuple[Demand, ...], cap: Vec, replicas: int | None
) -> dict[Vec, Option]:
    """Every useful option of one GPU (the best per vector), MPS with `replicas` clients."""
    mps = mps_options(view, demands, cap, replicas) if replicas else {}
    return merge(mig_options(view, demands, cap), whole_options(view, demands, cap), mps)


def objective(
    views: Sequence[GpuView], demands: Sequence[Demand], chosen: Sequence[Option]
) -> Objective:
    order = levels(demands)
    placed = [0] * len(order)
    used = stranded = kept = 0
    for view, option in zip(views, chosen, strict=False):
        for k, n in enumerate(option.vec):
            placed[order.index(demands[k].priority)] += n
        if option.mode != "unused":
            used += 1
            stranded += view.memory_mib - sum(
                n * d.memory_mib for n, d in zip(option.vec, demands, strict=False)
            )
        kept += option.kept
    return Objective(tuple(placed), used, stranded, kept)


def mps_candidates(views: Sequence[GpuView], demands: Sequence[Demand]) -> list[int | None]:
    """The MPS client counts worth trying: for each count, the classes that fit under
    memory // count stay the same up to the next count where one stops fitting."""
    shared = [d for d in demands if d.isolation == "shared"]
    total = sum(d.count for d in shared)
    ceiling = min(max(total, 2), MAX_PLUGIN_REPLICAS)
    found: set[int] = set()
    for view in views:
        for d in shared:
            t = min(view.usable // max(d.memory_mib, 1), ceiling)
            if t >= 2:
                found.add(t)
    return [*sorted(found)] if found else [None]


# Options of one GPU (MIG; MPS for one client count), in vectors times classes squared (what
# the frontier costs): 2,000,000 is 125,000 vectors of 4 classes, 31,250 of 8.
LIMIT = 2_000_000
SEARCH_LIMIT = 100_000  # option evaluations of one MPS client count (about half a second)
TOTAL_SEARCHES = 4  # all client counts together may use this many times SEARCH_LIMIT


def solve(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    limit: int = LIMIT,
    search_limit: int = SEARCH_LIMIT,
) -> Solution:
    """The best plan over every useful MPS client count (the fewest clients on a tie). Past
    the limits (many kinds of workloads, many MPS clients), a greedy plan instead, marked not
    exact."""
    cap = tuple(d.count for d in demands)
    candidates = mps_candidates(views, demands)
    best: Solution | None = None
    exact = True  # every client count was searched exactly
    # Each client count has its own budget (a shared one ran out on a 7-kind, 3-GPU file after
    # two counts and threw away their exact results); all counts together have a cap.
    total = TOTAL_SEARCHES * search_limit
    try:
        base: dict[tuple[object, ...], dict[Vec, Option]] = {}
        for view in views:
            if view.key not in base:
                base[view.key] = merge(
                    mig_options(view, demands, cap, limit), whole_options(view, demands, cap)
                )
    except TooLarge:
        base = {}
    for replicas in candidates:
        found: Solution | None = None
        if base and total > 0:
            budget = [min(search_limit, total)]
            try:
                tables = _tables(views, demands, cap, replicas, base, limit)
                found = _search(views, demands, tables, cap, replicas, budget)
            except TooLarge:
                pass
            total -= min(search_limit, total) - max(budget[0], 0)
        if found is None:  # too large for an exact search: this count gets the greedy plan
            exact = False
            found = _greedy(views, demands, cap, replicas)
        if best is None or found.objective.key > best.objective.key:
            best = found
    assert best is not None
    return best if exact else replace(best, exact=False)


def _tables(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    cap: Vec,
    replicas: int | None,
    base: dict[tuple[object, ...], dict[Vec, Option]],
    limit: int,
) -> list[Table]:
    """Each GPU's table (its MIG and whole options in `base`, MPS with `replicas` clients, the
    frontier), made once per kind of GPU: GPUs of equal keys have equal tables (8 alike GPUs,
    one table). Raises TooLarge."""
    kinds: dict[tuple[object, ...], Table] = {}
    for view in views:
        if view.key not in kinds:
            mps = mps_options(view, demands, cap, replicas, limit) if replicas else {}
            options = merge(base[view.key], mps)
            kinds[view.key] = Table(options, frontier(options), unused_option(view, len(cap)))
    return [kinds[view.key] for view in views]


def _greedy(
    views: Sequence[GpuView], demands: tuple[Demand, ...], cap: Vec, replicas: int | None
) -> Solution:
    """GPU by GPU, the option that places the most there (by priority), then the same terms
    as the search; each layout filled greedily."""
    score = _Scorer(views, demands)
    left, chosen = cap, []
    for i, view in enumerate(views):
        cands: list[Option | None] = [*mig_greedy(view, demands, left)]
        cands += whole_options(view, demands, left).values()
        if replicas:
            cands.append(mps_greedy(view, demands, left, replicas))
        cands.append(unused_option(view, len(cap)))
        option = max((o for o in cands if o is not None), key=lambda o: score(i, o))
        chosen.append(option)
        left = tuple(b - a for a, b in zip(option.vec, left, strict=True))
    return Solution(objective(views, demands, chosen), tuple(chosen), replicas, exact=False)


def _search(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    tables: list[Table],
    cap: Vec,
    replicas: int | None,
    budget: list[int],
) -> Solution:
    score = _Scorer(views, demands)
    n = len(tables)
    memo: dict[tuple[int, Vec], tuple[int, Option]] = {}

    def best(i: int, left: Vec) -> int:
        if i == n:
            return 0
        hit = memo.get((i, left))
        if hit is not None:
            return hit[0]
        table = tables[i]
        top: tuple[int, Option] | None = None
        seen: set[Vec] = set()
        budget[0] -= len(table.front)
        if budget[0] < 0:
            raise TooLarge("over the search limit")
        for vec in table.front:
            capped = tuple(a if a < b else b for a, b in zip(vec, left, strict=False))
            if capped in seen:
                continue
            seen.add(capped)
            option = table.options.get(capped)
            if option is None:  # nothing left that fits: the unused option covers it
                continue
            rest = tuple(b - a for a, b in zip(capped, left, strict=False))
            value = score(i, option) + best(i + 1, rest)
            if top is None or value > top[0]:
                top = (value, option)
        if table.unused is not None:  # last: on a tie, the GPUs of lower index are used
            value = score(i, table.unused) + best(i + 1, left)
            if top is None or value > top[0]:
                top = (value, table.unused)
        assert top is not None, "a GPU in use keeps at least its slices in use"
        memo[(i, left)] = top
        return top[0]

    best(0, cap)
    chosen: list[Option] = []
    left = cap
    for i in range(n):
        best(i, left)
        option = memo[(i, left)][1]
        chosen.append(option)
        left = tuple(b - a for a, b in zip(option.vec, left, strict=False))
    return Solution(objective(views, demands, chosen), tuple(chosen), replicas)


class _Scorer:
    """The objective terms of one option as one integer: sums of these compare as the
    objective does (each term's node-wide total fits below the next one's weight)."""

    def __init__(self, views: Sequence[GpuView], demands: tuple[Demand, ...]) -> None:
        self.views, self.demands = views, demands
        self.order = levels(demands)
        self.level_of = [self.order.index(d.priority) for d in demands]
        self.placed_base = sum(d.count for d in demands) + 1
        self.used_base = len(views) + 1
        self.memory_base = sum(v.memory_mib for v in views) + 1
        self.kept_base = sum(len(v.idle) + len(v.busy) for v in views) + 1
        self.cache: dict[tuple[int, Option], int] = {}

    def __call__(self, i: int, option: Option) -> int:
        key = (i, option)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        placed = [0] * len(self.order)
        need = 0
        for k, n in enumerate(option.vec):
            placed[self.level_of[k]] += n
            need += n * self.demands[k].memory_mib
        value = 0
        for p in placed:
            value = value * self.placed_base + p
        unused = option.mode == "unused"
        value = value * self.used_base + unused
        value = value * self.memory_base + (self.views[i].memory_mib if unused else need)
        value = value * self.kept_base + option.kept
        self.cache[key] = value
        return value
