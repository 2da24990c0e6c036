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
here by a small revised simplex in floats once per search, at the root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


class Prices:
    """Bounds for every suffix of the GPUs from a few price vectors: lambda . left plus the
    precomputed sums of M_g over the suffix, the smallest of them."""

    def __init__(
        self,
        unit: Sequence[int],
        kinds: Sequence[int],
        tables: Sequence[tuple[Sequence[tuple[Vec, int]], int | None]],
        prices: Sequence[Sequence[int]],
        digits: Digits,
    ) -> None:
        """`unit[k]`: what one replica of class k scores on a used GPU; `kinds[i]`: GPU i's
        table in `tables`, each ((vec, kept) of its options, its unused value or None)."""
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
        self.digits = digits
        n = len(kinds)
        self.top_memory = [max(digits.gpu_memory[i:], default=0) for i in range(n + 1)]
        self.kept = [sum(digits.kept[i:]) for i in range(n + 1)]

    def bound(
        self,
        i: int,
        left: Vec,
        first: tuple[Sequence[tuple[Vec, int]], int | None, int] | None = None,
    ) -> int:
        """An upper bound on the best score of GPUs i.. with `left` replicas to place;
        `first`: the options of the next GPUs (capped by `left`), their unused value and
        how many GPUs in a row have them, tighter than the whole tables.

        The relaxation's bound B is fractional in effect (0.2 of a GPU unused shows as a
        memory term no plan has); a plan's replicas placed and unused count are integers, so
        a plan scoring up to B has those terms at most B's, and, where equal, a memory term
        at most the memory left to place plus that of the unused GPUs."""
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
        d = self.digits
        weight = d.memory_base * d.kept_base
        head = b // weight
        unused = min(head % d.used_base, len(self.kept) - 1 - i)
        memory = sum(m * n for m, n in zip(d.memory, left, strict=True) if n)
        memory = min(memory + unused * self.top_memory[i], d.memory_base - 1)
        return min(b, head * weight + memory * d.kept_base + self.kept[i])


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
    basis = [-1 - r for r in range(rows)]  # slack r is column -1 - r
    inverse = [[float(r == c) for c in range(rows)] for r in range(rows)]
    x = b[:]
    duals = [0.0] * rows
    for _ in range(60 + 4 * rows):
        cb = [cost[j] if j >= 0 else 0.0 for j in basis]
        duals = [sum(cb[r] * inverse[r][c] for r in range(rows)) for c in range(rows)]
        enter, gain = None, 1e-9
        for j, col in enumerate(entries):
            d = cost[j] - sum(duals[r] * a for r, a in col)
            if d > gain:
                enter, gain = j, d
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
