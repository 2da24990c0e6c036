"""Past the search's budget: the replicas a better plan would place, each case checked. Pure.

A plan's score is the sum of its replicas' (per class, `Scorer.unit`), of its unused GPUs'
and of its slices kept. Between a plan found and the bound (nodeagent.planner.relax) there are
few such sums when they are close: the vectors of replicas placed (v <= what is asked) and
counts of unused GPUs (u) whose plans could score above the plan and at most the bound. Each
is checked, highest first, by the exact search capped to v and asked for at least what v
with u GPUs unused scores: a plan found is the new best one; when none of the cases above the
best can hold a plan, the best is proven. Too many cases: TooLarge (the caller's fallback).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nodeagent.planner.branch import Scorer, Sieve, Table, best_plan
from nodeagent.planner.options import Option, TooLarge, Vec
from nodeagent.planner.relax import Prices

CASES = 2_000  # (v, u) cases of a head at most
HEADS = 16  # heads between the plan and the bound at most
PER_CASE = 150  # option evaluations a case costs, about: what a whole head may take


def improve(
    tables: Sequence[Table],
    score: Scorer,
    cap: Vec,
    prices: Prices,
    best: int,
    budget: list[int],
) -> tuple[int, list[Option]] | None:
    """The best plan scoring above `best` (None: none does). Raises TooLarge past CASES
    cases of a head or the budget. The cases go head by head (replicas placed per level, GPUs
    unused), from the bound's down: all of a head checked, the bound drops below it."""
    top = prices.bound(0, cap)
    weight = score.memory_base * score.kept_base  # of the lowest head digit: GPUs unused
    found: tuple[int, list[Option]] | None = None
    sieve = Sieve(prices, tables)
    if top // weight - best // weight > HEADS:
        raise TooLarge("too many heads between the plan and the bound")
    while top > best:
        head = top // weight  # replicas placed per level and GPUs unused, at their most
        budget[0] -= 20  # a head costs a bound or so, and its cases one each (below)
        if budget[0] < 0:
            raise TooLarge("over the search limit")
        try:
            todo: list[tuple[int, int, Vec]] | None
            todo = _cases(tables, score, cap, max(best, head * weight - 1), top)
        except TooLarge:
            todo = None
        if head * weight > best:  # the whole head first (any plan of it, or none), on as
            # much budget as its cases would take
            limit = budget[0] if todo is None else PER_CASE * len(todo)
            share = [min(limit, budget[0])]
            budget[0] -= share[0]
            try:
                plan = best_plan(tables, score, cap, head * weight, share, prices, sieve, True)
            except TooLarge:
                pass
            else:
                budget[0] += share[0]
                if plan is None:
                    top = head * weight - 1
                    continue
                best, found = plan[0], plan
        if todo is None:
            raise TooLarge("too many cases between the plan and the bound")
        budget[0] -= len(todo)
        for upper, need, v in todo:
            if upper <= best:
                break
            plan = best_plan(tables, score, v, max(best + 1, need), budget, prices, sieve)
            if plan is not None:
                best, found = plan[0], plan
        top = head * weight - 1  # no plan of that head beats the best
    return found


def _cases(
    tables: Sequence[Table], score: Scorer, cap: Vec, best: int, top: int
) -> list[tuple[int, int, Vec]]:
    """(the most a plan placing v with u GPUs unused scores, the least, v) of every case
    whose most is above `best` and least at most `top`, highest first."""
    unused = sorted(
        (score(i, t.unused) for i, t in enumerate(tables) if t.unused is not None), reverse=True
    )
    most = [sum(unused[:u]) for u in range(len(unused) + 1)]
    least = [sum(sorted(unused)[:u]) for u in range(len(unused) + 1)]
    kept = score.kept_base - 1
    unit = [score.unit(k) for k in range(len(cap))]
    order = sorted(range(len(cap)), key=lambda k: -unit[k])
    rest = [0] * (len(order) + 1)  # the most the classes from j on add
    for j in range(len(order) - 1, -1, -1):
        rest[j] = rest[j + 1] + unit[order[j]] * cap[order[j]]
    out: list[tuple[int, int, Vec]] = []
    for u in range(len(unused) + 1):
        low, high = best - most[u] - kept, top - least[u]  # low < sum of units <= high
        for total, vec in _sums(unit, order, rest, cap, low, high):
            out.append((total + most[u] + kept, total + least[u], vec))
            if len(out) > CASES:
                raise TooLarge("too many cases between the plan and the bound")
    out.sort(key=lambda c: (-c[0], -c[1]))
    return out


def _sums(
    unit: Sequence[int],
    order: Sequence[int],
    rest: Sequence[int],
    cap: Vec,
    low: int,
    high: int,
    j: int = 0,
    total: int = 0,
    vec: tuple[int, ...] = (),
) -> Iterator[tuple[int, Vec]]:
    """Every v <= cap with low < unit . v <= high: the classes taken in `order` (`vec` holds
    the first j of them, summing to `total`; `rest[j]`: the most the others add)."""
    if total + rest[j] <= low or total > high:
        return
    if j == len(order):
        counts = [0] * len(cap)
        for k, n in zip(order, vec, strict=True):
            counts[k] = n
        yield total, tuple(counts)
        return
    k = order[j]
    for n in range(cap[k], -1, -1):
        here = total + n * unit[k]
        if here + rest[j + 1] <= low:
            break  # fewer of class k reach less still
        if here <= high:
            yield from _sums(unit, order, rest, cap, low, high, j + 1, here, (*vec, n))
