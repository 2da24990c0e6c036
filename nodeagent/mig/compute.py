"""Compute instances inside a GPU instance: the sizes a GI offers, where they sit, and how a
demand for compute-instance profiles (`1c.3g.40gb: 3`) is packed into GIs. Pure.

NVML reads compute-instance profiles and placements only from an existing GI, so the planner
cannot ask the driver before the GI exists; the rule below is the documented one (README,
"Compute-instance profiles", names its sources), and the emulator enforces the same:

- a GI of `g` compute slices offers the full CI (`c == g`) and every NVML size `c` with
  `2c <= g + 1` (go-nvlib's filter; every real `nvidia-smi mig -lcip` listing agrees: no 3c in
  a 4g, 3c and 4c in a 7g, one 2c in a 3g);
- a CI of `c` slices starts at a multiple of the smallest power of two >= c (1c anywhere, 2c
  at 0/2/4, 3c and 4c at 0/4), and ends within the GI.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import combinations

# Compute-instance sizes NVML defines (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,6,7,8}_SLICE).
CI_SIZES = (1, 2, 3, 4, 6, 7, 8)

Shape = tuple[int, ...]  # the CI sizes of one GI, largest first: (3,) full 3g, (1, 1, 1)
CiPlacement = tuple[int, int]  # (start, size) in compute slices inside the GI


def sizes_offered(gi_slices: int) -> tuple[int, ...]:
    """The CI sizes a GI of `gi_slices` compute slices offers (the full size included)."""
    return (*tuple(c for c in CI_SIZES if c < gi_slices and 2 * c <= gi_slices + 1), gi_slices)


def starts(gi_slices: int, size: int) -> tuple[int, ...]:
    """Where a CI of `size` slices may start inside a GI of `gi_slices` slices."""
    if size == gi_slices:
        return (0,)
    if size not in sizes_offered(gi_slices):
        return ()
    align = 1 << (size - 1).bit_length()
    return tuple(s for s in range(0, gi_slices - size + 1) if s % align == 0)


def full(gi_slices: int) -> Shape:
    return (gi_slices,)


def place(
    gi_slices: int, shape: Sequence[int], fixed: Iterable[CiPlacement] = ()
) -> tuple[CiPlacement, ...] | None:
    """Placements for every CI of `shape` not already among `fixed` (the CIs kept, which are
    part of the shape); None when they cannot all sit in the GI. Deterministic."""
    return _place(gi_slices, tuple(sorted(shape, reverse=True)), tuple(sorted(fixed)))


@lru_cache(maxsize=4096)
def _place(
    gi_slices: int, shape: Shape, fixed: tuple[CiPlacement, ...]
) -> tuple[CiPlacement, ...] | None:
    need = list(shape)
    for _, size in fixed:
        if size not in need:
            return None
        need.remove(size)
    taken: set[int] = set()
    for start, size in fixed:
        span = set(range(start, start + size))
        if taken & span or start + size > gi_slices:
            return None
        taken |= span
    placed: list[CiPlacement] = []

    def go(i: int) -> bool:
        if i == len(need):
            return True
        size = need[i]
        for start in starts(gi_slices, size):
            span = set(range(start, start + size))
            if taken & span:
                continue
            taken.update(span)
            placed.append((start, size))
            if go(i + 1):
                return True
            placed.pop()
            taken.difference_update(span)
        return False

    return tuple(placed) if go(0) else None


def pack(gi_slices: int, sizes: Sequence[int]) -> tuple[Shape, ...] | None:
    """Pack a demand of CI sizes into as few GIs of `gi_slices` slices as possible (first fit,
    largest first, as mig-parted fills a GI before it creates the next); None when a size is
    not offered."""
    if any(s not in sizes_offered(gi_slices) for s in sizes):
        return None
    bins: list[list[int]] = []
    for size in sorted(sizes, reverse=True):
        for b in bins:
            if place(gi_slices, (*b, size)) is not None:
                b.append(size)
                break
        else:
            bins.append([size])
    return tuple(sorted((tuple(b) for b in bins), reverse=True))


def partitions(gi_slices: int, sizes: Sequence[int], max_gis: int) -> list[tuple[Shape, ...]]:
    """Every way to group a demand of CI sizes into at most `max_gis` GIs whose CIs can all be
    placed (each a multiset of shapes, largest first); the same MIG devices, grouped
    differently. Used when the preferred packing would destroy a compute instance in use."""
    return sorted(_partitions(gi_slices, tuple(sorted(sizes, reverse=True)), max_gis))


@lru_cache(maxsize=1024)
def _partitions(gi_slices: int, sizes: Shape, max_gis: int) -> frozenset[tuple[Shape, ...]]:
    if not sizes:
        return frozenset({()})
    if max_gis <= 0:
        return frozenset()
    first, rest = sizes[0], sizes[1:]
    found: set[tuple[Shape, ...]] = set()
    for n in range(len(rest) + 1):  # the first CI's GI takes `first` and n of the others
        for others in set(combinations(rest, n)):
            shape = (first, *others)
            if place(gi_slices, shape) is None:
                continue
            left = list(rest)
            for size in others:
                left.remove(size)
            for tail in _partitions(gi_slices, tuple(left), max_gis - 1):
                found.add(tuple(sorted(((*shape,), *tail), reverse=True)))
    return frozenset(found)


def keepable(
    gi_slices: int, shape: Shape, existing: Sequence[CiPlacement], required: Sequence[CiPlacement]
) -> tuple[CiPlacement, ...] | None:
    """The existing CIs to keep when a GI changes to `shape`: every `required` one (in use),
    then as many of the others as still let the rest be placed; None if the required ones
    cannot stay."""
    return _keepable(gi_slices, tuple(shape), tuple(existing), tuple(required))


@lru_cache(maxsize=8192)
def _keepable(
    gi_slices: int,
    shape: Shape,
    existing: tuple[CiPlacement, ...],
    required: tuple[CiPlacement, ...],
) -> tuple[CiPlacement, ...] | None:
    if place(gi_slices, shape, required) is None:
        return None
    optional = [p for p in existing if p not in required]
    for n in range(len(optional), 0, -1):
        for extra in combinations(optional, n):
            if place(gi_slices, shape, (*required, *extra)) is not None:
                return tuple(sorted((*required, *extra)))
    return tuple(sorted(required))
