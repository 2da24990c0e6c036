"""Upper bounds for the exact search: a Lagrangian relaxation priced by its LP. Pure.

The search picks one option per GPU, the replicas of all options at most what is left. Move
that one constraint into the objective with a price per class (lambda >= 0): then every GPU
picks on its own, and for ANY prices

    best(GPUs i.., left) <= lambda . left + sum over GPUs g >= i of M_g(lambda),
    M_g(lambda) = max(its unused value, max over its options o of score(o) - lambda . o.vec).

(A replica priced above what it scores is left out of the option: the tables are closed
downwards.) The bound is exact integer arithmetic whatever the prices, so it never cuts an
optimal plan; the prices only decide how tight it is. The tightest prices are the duals of the
LP relaxation (each GPU a fraction of options, the classes' rows capped by what is left), found
here by a small revised simplex in floats once per search, at the root. The score's terms are
digits of one integer (replicas placed per level, GPUs unused, memory, slices kept): the
bound's lower digits are tightened as integers (Prices.bound) and, refined, each bounded on
its own among the plans whose higher digits are at their most (Level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul

Vec = tuple[int, ...]
Column = tuple[int, Vec, int]  # (score, replicas per class, row of its GPU kind)


@dataclass(frozen=True)
class Digits:
    """The score's lower terms: the unused GPUs' count, weighted memory_base * kept_base; the
    memory term (placed replicas' memory on used GPUs, a GPU's own when unused), weighted
    kept_base; the slices kept."""

    memory: Sequence[int]  # MiB of one replica, per class
    gpu_memory: Sequence[int]  # MiB per GPU
    kept: Sequence[int]  # existing slices per GPU
    kept_base: int
    memory_base: int
    used_base: int


class Lagrangian:
    """lambda . left plus the precomputed sums of M_g over the suffix, the smallest over a
    few price vectors: an upper bound on the best score of GPUs i.. for one linear score."""

    def __init__(
        self,
        unit: Sequence[int],
        kinds: Sequence[int],
        tables: Sequence[tuple[Sequence[tuple[Vec, int]], int | None]],
        prices: Sequence[Sequence[int]],
    ) -> None:
        """`unit[k]`: what one replica of class k scores on a used GPU; `kinds[i]`: GPU i's
        table in `tables`, each ((vec, kept) of its options, its unused value or None)."""
        self.unit, self.kinds, self.tables = unit, kinds, tables
        self.prices = [tuple(p) for p in prices]
        self.suffix: list[list[int]] = []
        self.gains: list[list[int]] = []
        for lam in self.prices:
            gain = [max(u - p, 0) for u, p in zip(unit, lam, strict=True)]
            self.gains.append(gain)
            best = [_most(gain, options, unused) for options, unused in tables]
            sums = [0] * (len(kinds) + 1)
            for i in range(len(kinds) - 1, -1, -1):
                sums[i] = sums[i + 1] + best[kinds[i]]
            self.suffix.append(sums)

    def raw(self, i: int, left: Vec, first: First | None = None) -> int:
        b = -1
        for lam, gain, sums in zip(self.prices, self.gains, self.suffix, strict=True):
            value = sum(p * n for p, n in zip(lam, left, strict=True) if n)
            if first is None:
                value += sums[i]
            else:
                options, unused, count = first
                value += count * _most(gain, options, unused) + sums[i + count]
            if b < 0 or value < b:
                b = value
        return b


First = tuple[Sequence[tuple[Vec, int]], int | None, int]


@dataclass(frozen=True)
class Level:
    """A bound on the score's digits below `weight` among the plans whose digits above it
    (H) are at their most: for any mu >= 0, such a plan's lower digits R satisfy
    R <= mu * H + R - mu * Hmax, and mu * H + R is a linear score bounded as the score is.
    (The relaxation's fractional top digits spill into the lower ones: 26.5 replicas read
    as 26 and 4 GPUs unused; this reads the unused count of 26 replicas.)"""

    weight: int
    mu: int
    bound: Lagrangian

    def scaled(self, value: int) -> int:
        return self.mu * (value // self.weight) + value % self.weight

    def cut(self, b: int, i: int, left: Vec, first: First | None) -> int:
        top = b // self.weight
        if first is not None:
            first = (first[0], None if first[1] is None else self.scaled(first[1]), first[2])
        rest = self.bound.raw(i, left, first) - self.mu * top
        if rest < 0:
            return top * self.weight - 1
        return min(b, top * self.weight + min(rest, self.weight - 1))


class Prices:
    """Bounds for every suffix of the GPUs: the Lagrangian one, its digits read as integers
    (see bound), tightened by the levels added with `refine`."""

    def __init__(self, core: Lagrangian, digits: Digits) -> None:
        self.core = core
        self.digits = digits
        self.levels: list[Level] = []
        self.refined = False
        n = len(core.kinds)
        self.top_memory = [max(digits.gpu_memory[i:], default=0) for i in range(n + 1)]
        self.kept = [sum(digits.kept[i:]) for i in range(n + 1)]
        self.step = math.gcd(*digits.memory)
        self.least = [  # per suffix, the memory of its u smallest GPUs
            [sum(sorted(digits.gpu_memory[i:])[:u]) for u in range(n - i + 1)] for i in range(n + 1)
        ]
        self.residues = _residues(digits.gpu_memory, self.step)

    def bound(self, i: int, left: Vec, first: First | None = None) -> int:
        """An upper bound on the best score of GPUs i.. with `left` replicas to place;
        `first`: the options of the next GPUs (capped by `left`), their unused value and
        how many GPUs in a row have them, tighter than the whole tables.

        The relaxation's bound B is fractional in effect (0.2 of a GPU unused shows as a
        memory term no plan has); a plan's replicas placed and unused count are integers, so
        a plan scoring up to B has those terms at most B's, and, where equal, a memory term
        at most the memory left to place plus that of the unused GPUs. That term is the placed
        replicas' memory (a multiple of the classes' common divisor) plus the memory of the
        unused GPUs: its remainder is one of those of so many unused GPUs, and the bound is
        rounded down to the largest such (a bound a few MiB above a plan is that plan's); it is
        at least the unused GPUs' own memory, or no plan has that head (the next one down
        is read the same way)."""
        b = self.core.raw(i, left, first)
        for level in self.levels:
            b = level.cut(b, i, left, first)
        d = self.digits
        weight = d.memory_base * d.kept_base
        placed = sum(m * n for m, n in zip(d.memory, left, strict=True) if n)
        for _ in range(2 * len(self.kept)):  # each round a lower head, or the bound
            head = b // weight
            unused = head % d.used_base
            if b < 0 or unused > len(self.kept) - 1 - i:
                return head * weight - 1  # no plan has that many GPUs unused: a lower head
            memory = min(placed + unused * self.top_memory[i], d.memory_base - 1)
            memory = min(memory, b % weight // d.kept_base)
            remainders = self.residues[i][unused]
            if remainders is not None:
                memory -= min((memory - r) % self.step for r in remainders)
            if memory < self.least[i][unused]:  # below the unused GPUs' own memory
                b = head * weight - 1
                for level in self.levels:  # each lower digit again, under the new head
                    b = level.cut(b, i, left, first)
                continue
            return min(b, head * weight + memory * d.kept_base + self.kept[i])
        return b

    def refine(self, columns: Sequence[Column], counts: Sequence[int], left: Vec) -> None:
        """Adds a level per lower digit (replicas placed / GPUs unused / memory / slices kept),
        its mu the best of a walk over powers of two (an LP each) at the state (0, left)."""
        self.refined = True
        d = self.digits
        weights = [d.used_base * d.memory_base * d.kept_base, d.memory_base * d.kept_base]
        if d.kept_base > 1:
            weights.append(d.kept_base)
        for weight in weights:
            top = self.bound(0, left)
            found: dict[int, tuple[int, Level]] = {}  # j -> (bound, level of mu weight >> j)
            for j in range(3, weight.bit_length(), 3):  # every third power, then beside the best
                self._attempt(found, weight, j, columns, counts, left)
                least = min(v for v, _ in found.values())
                if least < top and found[j][0] > least:
                    break  # past the best: the bound only grows from here (it is unimodal in j)
            if not found:
                continue
            best = min(found, key=lambda j: found[j][0])
            for j in (best - 1, best + 1):
                self._attempt(found, weight, j, columns, counts, left)
            best = min(found, key=lambda j: found[j][0])
            if found[best][0] < top:
                self.levels.append(found[best][1])

    def _attempt(
        self,
        found: dict[int, tuple[int, Level]],
        weight: int,
        j: int,
        columns: Sequence[Column],
        counts: Sequence[int],
        left: Vec,
    ) -> None:
        if j in found or not 0 < j < weight.bit_length():
            return
        self.levels.append(self._level(weight, weight >> j, columns, counts, left))
        found[j] = (self.bound(0, left), self.levels.pop())

    def _level(
        self, weight: int, mu: int, columns: Sequence[Column], counts: Sequence[int], left: Vec
    ) -> Level:
        def scaled(value: int) -> int:
            return mu * (value // weight) + value % weight

        lam, _ = lp_prices([(scaled(c), vec, k) for c, vec, k in columns], left, counts)
        core = self.core
        unit = [scaled(u) for u in core.unit]
        tables = [(o, None if u is None else scaled(u)) for o, u in core.tables]
        return Level(weight, mu, Lagrangian(unit, core.kinds, tables, [lam]))


def _residues(memory: Sequence[int], step: int) -> list[list[frozenset[int] | None]]:
    """Per suffix of the GPUs and per count u of them unused: the remainders modulo `step`
    of the memory of u of them (None: too many to list, or no common step)."""
    n = len(memory)
    out: list[list[frozenset[int] | None]] = [[None] * (n + 1) for _ in range(n + 1)]
    if step <= 1:
        return out
    sets: list[set[int] | None] = [{0}]
    sets += [set() for _ in range(n)]
    out[n][0] = frozenset({0})
    for i in range(n - 1, -1, -1):
        r = memory[i] % step
        for u in range(n - i, 0, -1):
            below, here = sets[u - 1], sets[u]
            if below is None or here is None or len(below) + len(here) > 64:
                sets[u] = None
            else:
                here.update((x + r) % step for x in below)
        out[i] = [frozenset(x) if x is not None else None for x in sets]
    return out


def _most(gain: Sequence[int], options: Sequence[tuple[Vec, int]], unused: int | None) -> int:
    top = 0 if unused is None else unused
    for vec, kept in options:
        value = kept + sum(g * n for g, n in zip(gain, vec, strict=True) if n)
        if value > top:
            top = value
    return top


def lp_prices(
    columns: Sequence[Column], left: Vec, counts: Sequence[int]
) -> tuple[list[int], list[tuple[int, float]]]:
    """Near-optimal duals of the class rows of: max sum score.x, sum x.vec <= left, per GPU
    kind sum x <= its GPUs, x >= 0 (revised simplex, Dantzig's rule, at most 60 + 4 rows
    pivots; any prices are valid, so a stop short of the optimum only loosens the bound),
    and the solution: (column, x) of the columns in the basis."""
    width = len(left)
    rows = width + len(counts)
    b = [float(n) for n in (*left, *counts)]
    scale = float(max((c for c, _, _ in columns), default=1) or 1)
    cost = [c / scale for c, _, _ in columns]
    entries = [
        [(k, float(n)) for k, n in enumerate(vec) if n] + [(width + kind, 1.0)]
        for _, vec, kind in columns
    ]
    vecs = [tuple(float(n) for n in vec) for _, vec, _ in columns]  # for the pricing
    kinds = [width + kind for _, _, kind in columns]
    basis = [-1 - r for r in range(rows)]  # slack r is column -1 - r
    inverse = [[float(r == c) for c in range(rows)] for r in range(rows)]
    x = b[:]
    duals = [0.0] * rows
    for _ in range(60 + 4 * rows):
        cb = [cost[j] if j >= 0 else 0.0 for j in basis]
        duals = [sum(cb[r] * inverse[r][c] for r in range(rows)) for c in range(rows)]
        enter, gain = None, 1e-9
        head = duals[:width]
        reduced = [
            c - duals[k] - sum(map(mul, head, v)) for c, v, k in zip(cost, vecs, kinds, strict=True)
        ]
        best = max(reduced, default=0.0)
        if best > gain:
            enter, gain = reduced.index(best), best
        for r in range(rows):  # a slack back in: its dual went negative
            if -duals[r] > gain:
                enter, gain = -1 - r, -duals[r]
        if enter is None:
            break
        col = entries[enter] if enter >= 0 else [(-1 - enter, 1.0)]
        u = [sum(inverse[r][c] * a for c, a in col) for r in range(rows)]
        leave, ratio = -1, 0.0
        for r in range(rows):
            if u[r] > 1e-9 and (leave < 0 or x[r] / u[r] < ratio):
                leave, ratio = r, x[r] / u[r]
        if leave < 0:
            break  # cannot happen: every column sits in its kind's row
        pivot = inverse[leave]
        pu = u[leave]
        pivot[:] = [v / pu for v in pivot]
        x[leave] = ratio
        for r in range(rows):
            if r != leave and u[r]:
                f = u[r]
                row = inverse[r]
                for c in range(rows):
                    row[c] -= f * pivot[c]
                x[r] -= f * ratio
        basis[leave] = enter
    prices = [max(round(duals[k] * scale), 0) for k in range(width)]
    return prices, [(j, x[r]) for r, j in enumerate(basis) if j >= 0]
