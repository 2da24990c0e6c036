"""The exact search itself: branch and bound over one option per GPU. Pure.

Depth first over the GPUs in order, each GPU's options in the order of its frontier (capped by
what is left, each once, the unused option last). A branch is cut where the bound of
nodeagent.planner.relax says it cannot reach the score wanted; a state (GPU, demand left) met
again, as alike GPUs taking the same options in another order do, is answered from what was
proven about it (its best score, or an upper bound). The plan found is the first best one in
that order: the one a full dynamic programme over (GPU, demand left) picks. A state's options
are sifted by the prices before any is bounded (Sieve: an option whose price-reduced score
cannot reach the goal is never capped or bounded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent.planner.options import Demand, GpuView, Option, TooLarge, Vec
from nodeagent.planner.relax import Column, Digits, Lagrangian, Prices, lp_prices


@dataclass(frozen=True)
class Table:
    """One GPU's options for the search."""

    options: dict[Vec, Option]
    front: tuple[Vec, ...]
    unused: Option | None  # None: the GPU must stay as it is used (slices in use)


NOTHING = -(1 << 256)  # the score of no plan: below every goal, negative ones included


def levels(demands: Sequence[Demand]) -> tuple[int, ...]:
    return tuple(sorted({d.priority for d in demands}, reverse=True))


Rounded = list[tuple[int, Vec | None, int]]  # the LP's solution rounded down (_relaxation)
Relaxed = tuple[tuple[Table, ...], Prices, Rounded, list[Column], list[int]]


class Scorer:
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
        self.relaxed: dict[tuple[tuple[int, ...], Vec], Relaxed] = {}

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

    def unit(self, k: int) -> int:
        """What one replica of class k scores on a used GPU (a used option scores the sum of
        its replicas' plus its slices kept)."""
        value = 0
        for level in range(len(self.order)):
            value = value * self.placed_base + (level == self.level_of[k])
        value = value * self.used_base
        value = value * self.memory_base + self.demands[k].memory_mib
        return value * self.kept_base


def best_plan(
    tables: Sequence[Table],
    score: Scorer,
    cap: Vec,
    need: int,
    budget: list[int],
    prices: Prices | None = None,
    sieve: Sieve | None = None,
    first: bool = False,
) -> tuple[int, list[Option]] | None:
    """The first best plan (its score and one option per GPU) when its score is at least
    `need`; None when none is. Raises TooLarge once `budget` (option evaluations) is spent.
    `prices`: the bounds to use (the tables' own by default), `sieve` made of them;
    `first`: the first plan found scoring at least `need`, not the best."""
    n = len(tables)
    prices = prices or bounds(tables, score, cap)
    solved: dict[tuple[int, Vec], tuple[int, Option]] = {}  # the best from a state, exact
    capped: dict[tuple[int, Vec], int] = {}  # an upper bound proven for a state
    runs = [1] * n  # GPUs in a row from i on with the same table
    for i in range(n - 2, -1, -1):
        if tables[i + 1] is tables[i]:
            runs[i] = runs[i + 1] + 1
    sieve = sieve or Sieve(prices, tables)

    def best(i: int, left: Vec, need: int) -> int:
        """The best score of GPUs i.. when it is at least `need` (then in `solved`); below
        `need`, an upper bound of it."""
        if i == n:
            return 0
        key = (i, left)
        hit = solved.get(key)
        if hit is not None:
            return hit[0]
        ceiling = capped.get(key)
        if ceiling is None:
            budget[0] -= 20  # a bound costs about as much as 20 options looked at
            ceiling = prices.bound(i, left)
        if ceiling < need:
            return ceiling
        table = tables[i]
        budget[0] -= 2 * len(table.front)  # capped, then bounded
        if budget[0] < 0:
            raise TooLarge("over the search limit")
        top: tuple[int, Option] | None = None
        proven = NOTHING  # no option fits (a GPU held to one option by rounded_plan)
        passed = sieve.passing(i, left, need, ceiling)
        if len(passed) < len(table.front):
            proven = need - 1  # the options sifted out reach less
        options = choices(table, left, passed)
        for option in options:
            s = score(i, option)
            goal = (top[0] + 1 if top else need) - s
            rest = tuple(b - a for a, b in zip(option.vec, left, strict=True))
            value = best(i + 1, rest, goal)
            if value >= goal:
                top = (s + value, option)
                if first:
                    break
            elif s + value > proven:
                proven = s + value
        if top is not None:
            solved[key] = top
            return top[0]
        capped[key] = proven
        return proven

    if best(0, cap, need) < need:
        return None
    chosen: list[Option] = []
    left = cap
    for i in range(n):
        option = solved[(i, left)][1]
        chosen.append(option)
        left = tuple(b - a for a, b in zip(option.vec, left, strict=True))
    return solved[(0, cap)][0], chosen


class Sieve:
    """The options of a state that may reach a score, sifted by the prices alone: through
    option o (capped to c <= o.vec), a plan from (i, left) scores at most
    lambda . left + (the suffix's sum from i + 1) + M_o, M_o = kept + gain . o.vec >=
    score(c) - lambda . c; for a level (mu, weight), the same for mu * H + R, which every plan
    scoring at least `need` has at least mu * Hn + Rn (need = Hn * weight + Rn) where no plan
    of the state has H above Hn (its bound says so), mu * Hn + min(Rn, mu) otherwise."""

    def __init__(self, prices: Prices, tables: Sequence[Table]) -> None:
        self.cores = [(prices.core, 0, 0)]
        self.cores += [(level.bound, level.weight, level.mu) for level in prices.levels]
        self.margins: dict[int, list[tuple[Vec, tuple[int, ...]]]] = {}
        for table in tables:
            if id(table) in self.margins:
                continue
            rows = []
            for vec in table.front:
                kept = table.options[vec].kept
                rows.append((vec, tuple(
                    kept + sum(g * n for g, n in zip(core.gains[0], vec, strict=True) if n)
                    for core, _, _ in self.cores
                )))  # fmt: skip
            self.margins[id(table)] = rows
        self.tables = tables

    def passing(self, i: int, left: Vec, need: int, ceiling: int) -> set[Vec]:
        """The frontier vectors of GPU i's table that may reach `need` from (i, left)."""
        floors = []
        for core, weight, mu in self.cores:
            lam, sums = core.prices[0], core.suffix[0]
            goal = need
            if weight:
                high, low = divmod(need, weight)
                goal = mu * high + (low if ceiling // weight <= high else min(low, mu))
            floors.append(goal - sum(p * n for p, n in zip(lam, left, strict=True) if n)
                          - sums[i + 1])  # fmt: skip
        out = set()
        for vec, margins in self.margins[id(self.tables[i])]:
            if all(m >= f for m, f in zip(margins, floors, strict=True)):
                out.add(vec)
        return out


def choices(table: Table, left: Vec, among: set[Vec] | None = None) -> list[Option]:
    """A GPU's options capped by what is left, each once, in frontier order, unused last;
    `among`: only these frontier vectors (and unused)."""
    out: list[Option] = []
    seen: set[Vec] = set()
    for vec in table.front:
        if among is not None and vec not in among:
            continue
        capped = tuple(a if a < b else b for a, b in zip(vec, left, strict=True))
        if capped in seen:
            continue
        seen.add(capped)
        option = table.options.get(capped)
        if option is not None:  # None: nothing left that fits; the unused option covers it
            out.append(option)
    if table.unused is not None:
        out.append(table.unused)
    return out


def bounds(tables: Sequence[Table], score: Scorer, cap: Vec, refine: bool = False) -> Prices:
    """The bounds of every state (see _relaxation); `refine`: each lower digit bounded on its
    own too (nodeagent.planner.relax.Level: a few more LPs, a bound closer to the plans)."""
    return _relaxation(tables, score, cap, refine)[0]


def _relaxation(
    tables: Sequence[Table], score: Scorer, cap: Vec, refine: bool = False
) -> tuple[Prices, Rounded]:
    """The bounds of every state: the LP's prices at the root, no prices (every GPU at its
    best) and full ones (every replica placed, every GPU unused); and the LP's solution
    rounded down: (kind, vector or None for unused, how many GPUs). Made once per tables
    and demand for a Scorer (it keeps the tables, so their ids name them), refined once."""
    key = (tuple(id(t) for t in tables), cap)
    hit = score.relaxed.get(key)
    if hit is None:
        hit = score.relaxed[key] = (tuple(tables), *_relax(tables, score, cap))
    _, prices, rounded, columns, counts = hit
    if refine and not prices.refined:
        prices.refine(columns, counts, cap)
    return prices, rounded


def _relax(
    tables: Sequence[Table], score: Scorer, cap: Vec
) -> tuple[Prices, Rounded, list[Column], list[int]]:
    ids: dict[int, int] = {}
    kinds: list[int] = []
    rows: list[tuple[list[tuple[Vec, int]], int | None]] = []
    columns: list[tuple[int, Vec, int]] = []
    unused_columns: set[int] = set()
    counts: list[int] = []
    for i, table in enumerate(tables):
        if id(table) not in ids:
            ids[id(table)] = len(rows)
            unused = score(i, table.unused) if table.unused is not None else None
            rows.append(([(vec, table.options[vec].kept) for vec in table.front], unused))
            columns += [(score(i, table.options[vec]), vec, len(counts)) for vec in table.front]
            if unused is not None:
                unused_columns.add(len(columns))
                columns.append((unused, (0,) * len(cap), len(counts)))
            counts.append(0)
        kinds.append(ids[id(table)])
        counts[ids[id(table)]] += 1
    unit = [score.unit(k) for k in range(len(cap))]
    view_of = score.views
    digits = Digits(
        memory=[d.memory_mib for d in score.demands],
        gpu_memory=[v.memory_mib for v in view_of],
        kept=[len(v.idle) + len(v.busy) for v in view_of],
        kept_base=score.kept_base,
        memory_base=score.memory_base,
        used_base=score.used_base,
    )
    lam, solution = lp_prices(columns, cap, counts)
    rounded = [
        (columns[j][2], None if j in unused_columns else columns[j][1], int(x + 1e-6))
        for j, x in solution
        if x + 1e-6 >= 1
    ]
    prices = Prices(Lagrangian(unit, kinds, rows, [lam, [0] * len(unit), unit]), digits)
    return prices, rounded, columns, counts


def rounded_plan(
    tables: Sequence[Table], score: Scorer, cap: Vec, budget: list[int], need: int = 0
) -> tuple[int, int, list[Option]] | None:
    """The root's bound, and a plan from the LP's solution rounded down (whole GPUs of its
    options, the first GPUs of their kind), the other GPUs searched exactly for the rest
    (with `need`: the first plan found scoring that); None when that finds no plan. Raises
    TooLarge past the budget."""
    prices, rounded = _relaxation(tables, score, cap)
    first: dict[int, int] = {}  # kinds numbered as _relaxation numbers them
    kinds: dict[int, list[int]] = {}  # kind -> its GPUs, in order
    for i, table in enumerate(tables):
        kinds.setdefault(first.setdefault(id(table), len(first)), []).append(i)
    forced = list(tables)
    for kind, vec, copies in rounded:
        gpus = [i for i in kinds.get(kind, []) if forced[i] is tables[i]][:copies]
        for i in gpus:
            table = tables[i]
            if vec is None:  # left unused (scored as such: no other option)
                assert table.unused is not None
                forced[i] = Table({}, (), table.unused)
            else:  # capped by what is left, as any option is
                forced[i] = Table(table.options, (vec,), None)
    found = best_plan(forced, score, cap, need, budget, first=need > 0)
    if found is None:
        return None
    return prices.bound(0, cap), found[0], found[1]
