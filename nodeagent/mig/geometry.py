"""MIG layout rules of one GPU model, and enumeration of the layouts that satisfy them. Pure.

The rules are the hardware's (DESIGN.md, "NVML facts"): instances sit at one of their
profile's placements and never overlap; at most `instance_count` of a profile; at most one
`+me` profile per GPU; the compute slices of all instances fit in the GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

from nodeagent.nvml.inventory import GiProfile, Gpu, Placement


@dataclass(frozen=True, order=True)
class Instance:
    """A GPU instance in a layout: a profile at a placement."""

    start: int
    size: int
    profile_id: int

    @property
    def placement(self) -> Placement:
        return Placement(self.start, self.size)

    @property
    def slots(self) -> frozenset[int]:
        return frozenset(range(self.start, self.start + self.size))


Layout = tuple[Instance, ...]


@dataclass(frozen=True)
class Geometry:
    """The layout rules of one GPU model, built from its profile table."""

    profiles: tuple[GiProfile, ...]
    memory_slices: int

    @classmethod
    def of(cls, gpu: Gpu) -> Geometry:
        return cls(gpu.profiles, gpu.memory_slice_count)

    @property
    def compute_slices(self) -> int:
        return max((p.slice_count for p in self.profiles), default=0)

    def profile(self, profile_id: int) -> GiProfile:
        for p in self.profiles:
            if p.id == profile_id:
                return p
        raise KeyError(profile_id)

    def by_name(self, name: str) -> GiProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def instances(self, profile: GiProfile) -> tuple[Instance, ...]:
        return tuple(Instance(p.start, p.size, profile.id) for p in profile.placements)

    def fits(self, layout: Iterable[Instance], new: Instance) -> bool:
        """Can `new` join `layout` under the hardware's rules?"""
        profile = self.profile(new.profile_id)
        if (new.start, new.size) not in {(p.start, p.size) for p in profile.placements}:
            return False
        taken: set[int] = set()
        same = compute = 0
        me = profile.name.endswith("+me")
        for inst in layout:
            taken |= inst.slots
            other = self.profile(inst.profile_id)
            same += inst.profile_id == new.profile_id
            compute += other.slice_count
            if me and other.name.endswith("+me"):
                return False
        if taken & new.slots or same >= profile.instance_count:
            return False
        return compute + profile.slice_count <= self.compute_slices

    def valid(self, layout: Iterable[Instance]) -> bool:
        placed: list[Instance] = []
        for inst in layout:
            if not self.fits(placed, inst):
                return False
            placed.append(inst)
        return True

    def layouts(
        self, counts: Mapping[int, int], required: Iterable[Instance] = ()
    ) -> Iterator[Layout]:
        """Every valid layout holding exactly `counts[profile_id]` instances of each profile
        and every instance of `required`. Deterministic order."""
        return iter(_layouts(self, tuple(sorted(counts.items())), tuple(sorted(required))))

    def max_count(self, profile: GiProfile) -> int:
        """The most instances of one profile that fit on an empty GPU."""
        for n in range(profile.instance_count, 0, -1):
            if next(self.layouts({profile.id: n}), None) is not None:
                return n
        return 0

    def fits_counts(self, counts: Mapping[int, int]) -> bool:
        return next(self.layouts(counts), None) is not None


@lru_cache(maxsize=4096)
def _layouts(
    geometry: Geometry, counts: tuple[tuple[int, int], ...], required: tuple[Instance, ...]
) -> tuple[Layout, ...]:
    if not geometry.valid(required):
        return ()
    need = dict(counts)
    for inst in required:
        need[inst.profile_id] = need.get(inst.profile_id, 0) - 1
    if any(n < 0 for n in need.values()):
        return ()
    # Biggest profiles first: fewest placements, strongest pruning.
    order = sorted(
        (pid for pid, n in need.items() if n > 0),
        key=lambda pid: (-geometry.profile(pid).placements[0].size, pid),
    )
    results: list[Layout] = []

    def place(i: int, layout: tuple[Instance, ...]) -> None:
        if i == len(order):
            results.append(tuple(sorted(layout)))
            return
        pid = order[i]
        free = [c for c in geometry.instances(geometry.profile(pid)) if geometry.fits(layout, c)]
        for combo in combinations(free, need[pid]):
            trial = layout
            ok = True
            for inst in combo:
                if not geometry.fits(trial, inst):
                    ok = False
                    break
                trial = (*trial, inst)
            if ok:
                place(i + 1, trial)

    place(0, required)
    return tuple(results)
