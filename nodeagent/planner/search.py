"""The exact search: one option per GPU, the best node-wide objective. Pure.

The objective, compared in this order:
  1. replicas placed, priority level by priority level (higher priorities first);
  2. fewer GPUs used (a GPU left whole is free for other work);
  3. less memory stranded: the memory of the used GPUs that placed workloads do not need;
  4. more existing MIG slices kept.
Every term is a sum over GPUs, so a search over the GPUs, keyed by the demand still unplaced,
is exact (nodeagent.planner.branch: branch and bound, bounded by nodeagent.planner.relax). Each GPU
only needs the options no other option of its own beats (more of every class, as many slices
kept), capped by what is left: any optimal plan can be rewritten into such options without
losing on any term (tests/unit/plan prove the search equal to an exhaustive one). MPS
clients per GPU are daemon-wide: every useful count is tried (the counts where a class stops
fitting under memory // replicas, at most 48, the device plugin's limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nodeagent.mps.settings import MAX_PLUGIN_REPLICAS
from nodeagent.planner.branch import Scorer, Table, best_plan, bounds, levels, rounded_plan
from nodeagent.planner.options import (
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
from nodeagent.planner.relax import Prices
from nodeagent.planner.targets import improve


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
SEARCH_LIMIT = 300_000  # option evaluations (a bound: 20) of one MPS client count (about 0.3 s)
TOTAL_SEARCHES = 3  # all client counts together may use this many times SEARCH_LIMIT
FIRST_LIMIT = 5_000  # the short search, before the LP's rounded plan is tried
TIE_LIMIT = 10_000  # the first best plan, once the rounded plan is known to be a best one
ROUND_LIMIT = 250_000  # the rest of the GPUs beside the LP's rounded plan, meeting the bound
ROUND_REST_LIMIT = 100_000  # the rest of the GPUs beside the LP's rounded plan, the best


def solve(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    limit: int = LIMIT,
    search_limit: int = SEARCH_LIMIT,
) -> Solution:
    """The best plan over every useful MPS client count (the fewest clients on a tie). The
    counts are searched best bound first, each only for a plan that beats the best found so
    far: a count whose bound cannot is never searched. Past the limits (many kinds of
    workloads, many MPS clients), a greedy plan for the count, the result marked not exact
    unless that count's bound shows it could not have won."""
    cap = tuple(d.count for d in demands)
    candidates = mps_candidates(views, demands)
    score = Scorer(views, demands)
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
        counts = []
        for rank, replicas in enumerate(candidates):
            tables = _tables(views, demands, cap, replicas, base, limit)
            counts.append((bounds(tables, score, cap).bound(0, cap), -rank, replicas, tables))
    except TooLarge:
        return replace(_best_greedy(views, demands, cap, candidates, score), exact=False)
    counts.sort(key=lambda c: (c[0], c[1]), reverse=True)
    best: tuple[int, int, Solution] | None = None  # (score, -rank, solution)
    missed: list[tuple[int, int]] = []  # (bound, -rank) of the counts searched greedily
    for bound, rank, replicas, tables in counts:
        if best is not None and (bound, rank) <= best[:2]:
            continue  # cannot beat the best found
        need = 0 if best is None else best[0] + (rank < best[1])
        budget = [min(search_limit, total)]
        exact, found = _search(views, demands, tables, cap, replicas, need, budget, score)
        if not exact:  # too large for an exact search: the better of the greedy plan and it
            missed.append((bound, rank))
            greedy = _greedy(views, demands, cap, replicas)
            if found is None or _value(score, greedy) > _value(score, found):
                found = greedy
        total -= min(search_limit, total) - max(budget[0], 0)
        if found is not None:
            value = _value(score, found)
            if best is None or (value, rank) > best[:2]:
                best = (value, rank, found)
    assert best is not None
    exact = all(m <= best[:2] for m in missed)
    return replace(best[2], exact=exact)


def _search(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    tables: list[Table],
    cap: Vec,
    replicas: int | None,
    need: int,
    budget: list[int],
    score: Scorer,
) -> tuple[bool, Solution | None]:
    """(exact, the first best plan of one client count) when it scores at least `need`
    (None: none does); not exact when the budget ran out (then the best plan seen, if any).

    A short search first (most files end there). Past it, the plan to beat: the LP's
    solution rounded down, the rest searched (first for a plan meeting the bound, then for
    the best; the greedy plan where that runs out). Where it falls short of the bound, the
    bound is refined and the cases between them checked (nodeagent.planner.targets; where
    they are too many, the branch and bound with the plan's score as the floor). The best
    plan known then, the first best plan (the one a longer search finds) is looked for with
    its score as the floor, on a small budget, the plan known kept if that runs out."""

    def solution(options: Sequence[Option]) -> Solution:
        return Solution(objective(views, demands, options), tuple(options), replicas)

    prices: list[Prices] = []  # the refined bounds, once the short search ran out

    def search(floor: int, limit: int) -> Solution | None:
        share = [min(limit, budget[0])]
        budget[0] -= share[0]
        try:
            plan = best_plan(tables, score, cap, floor, share, prices[0] if prices else None)
        finally:
            budget[0] += max(share[0], 0)
        return solution(plan[1]) if plan is not None else None

    try:
        return True, search(need, FIRST_LIMIT)
    except TooLarge:
        pass
    try:
        share = [min(ROUND_LIMIT, budget[0])]
        budget[0] -= share[0]
        # first a plan that meets the bound, if the LP's rounding leads to one, quickly
        top = bounds(tables, score, cap).bound(0, cap)
        rounded = rounded_plan(tables, score, cap, share, top)
        budget[0] += share[0]
        if rounded is None:  # else the best the rounding leads to
            share = [min(ROUND_REST_LIMIT, budget[0])]
            budget[0] -= share[0]
            rounded = rounded_plan(tables, score, cap, share)
            budget[0] += share[0]
    except TooLarge:
        rounded = None
    # the plan to beat (the greedy one only without the rounded one: it costs as much)
    plan = solution(rounded[2]) if rounded else _greedy(views, demands, cap, replicas)
    value = _value(score, plan)
    plain = bounds(tables, score, cap)
    if value < plain.bound(0, cap):  # a gap: each lower digit bounded on its own too
        prices.append(bounds(tables, score, cap, refine=True))
    else:
        prices.append(plain)
    top = prices[0].bound(0, cap)
    if top < need:
        return True, None
    try:
        better = improve(tables, score, cap, prices[0], max(value, need - 1), budget)
    except TooLarge:
        try:  # the branch and bound alone, from the best plan known
            better = best_plan(tables, score, cap, max(value, need - 1) + 1, budget, prices[0])
        except TooLarge:
            return False, plan if value >= need else None
    if better is not None:
        plan, value = solution(better[1]), better[0]
    if value < need:
        return True, None
    try:  # the first best plan, as the search finds it, if the budget holds
        return True, search(value, TIE_LIMIT)
    except TooLarge:
        return True, plan


def _value(score: Scorer, solution: Solution) -> int:
    return sum(score(i, o) for i, o in enumerate(solution.options))


def _best_greedy(
    views: Sequence[GpuView],
    demands: tuple[Demand, ...],
    cap: Vec,
    candidates: Sequence[int | None],
    score: Scorer,
) -> Solution:
    plans = [_greedy(views, demands, cap, r) for r in candidates]
    values = [_value(score, p) for p in plans]
    return plans[values.index(max(values))]


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
    score = Scorer(views, demands)
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
