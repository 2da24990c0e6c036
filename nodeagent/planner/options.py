"""What one GPU can hold: every way to place demand on it (MIG layout, MPS share, whole). Pure.

Demand comes in classes (workloads that are alike: memory, compute, isolation, priority); an
option is a vector of replicas per class plus how the GPU holds them. For MIG, every valid
layout of the GPU's profiles (plain ones, and those of its existing slices) is enumerated, in-use
slices always kept; each slice holds at most one replica that fits it (memory and SMs). For MPS,
`replicas` clients share the GPU, each limited to memory // replicas, their compute needs
summing to at most 100 %. A whole GPU holds one exclusive or shared replica.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations_with_replacement

from nodeagent.mig.geometry import Geometry, Instance, Layout
from nodeagent.mig.plan import existing_instances
from nodeagent.nvml.inventory import GiProfile, Gpu

Vec = tuple[int, ...]
MIB = 1 << 20
NEW, IDLE, BUSY = 0, 1, 2  # a slice of a layout: to create, existing and idle, existing in use
MODE_RANK = {"mig": 0, "whole": 1, "mps": 2}  # on a tie, a slice over a whole GPU over MPS


def ceil_percent(fraction: float) -> int:
    """A fraction of a GPU as whole per cent, rounded up (0.221 -> 23), read to a millionth so
    that 0.07 is 7, not 8 (0.07 * 100 is 7.000000000000001)."""
    return -(-round(fraction * 10**6) * 100 // 10**6)


@dataclass(frozen=True)
class Demand:
    """A class of alike workload replicas."""

    memory_mib: int
    compute: float | None
    sms: int | None
    isolation: str
    priority: int
    count: int
    step: int = 1  # an MPS client's percentage is a multiple of this (a DRA share's: 5)

    def sms_on(self, gpu_sms: int | None) -> int | None:
        """SMs it needs on a GPU of `gpu_sms` SMs; None when that cannot be known."""
        if self.sms is not None:
            return self.sms if gpu_sms is not None else None
        if self.compute is not None:
            return -(-round(self.compute * 10**6) * gpu_sms // 10**6) if gpu_sms else None
        return 0

    def percent_on(self, gpu_sms: int | None) -> int | None:
        """The MPS thread percentage it needs (0: no need given), rounded up to a multiple of
        `step`; with a step above 1 at least one step (a DRA share asks for at least that)."""
        if self.compute is not None:
            percent = ceil_percent(self.compute)
        elif self.sms is not None:
            if not gpu_sms:
                return None
            percent = -(-self.sms * 100 // gpu_sms)
        else:
            percent = 0
        if self.step == 1:
            return percent
        return max(self.step, -(-percent // self.step) * self.step)


@dataclass(frozen=True)
class GpuView:
    """What the planner reads of one GPU."""

    index: int
    memory_mib: int
    sms: int | None  # of the whole GPU: its full-size MIG profile's
    geometry: Geometry | None  # None: not MIG capable
    candidates: tuple[int, ...]  # profile ids the planner may create
    idle: frozenset[Instance]
    busy: frozenset[Instance]
    usable_mib: int = 0  # what MPS clients or a whole-GPU job can have (0: memory_mib)

    @classmethod
    def of(cls, gpu: Gpu) -> GpuView:
        existing = existing_instances(gpu) if gpu.mig_current else []
        idle = frozenset(gi.instance for gi in existing if not gi.in_use)
        busy = frozenset(gi.instance for gi in existing if gi.in_use)
        plain = [p.id for p in gpu.profiles if "+" not in p.name and "-" not in p.name]
        ids = sorted(set(plain) | {i.profile_id for i in idle | busy})
        # MIG cannot be enabled under running processes (the change stays pending): a MIG-off
        # GPU with processes (MPS clients, an exclusive job) is offered no MIG layout.
        running = not gpu.mig_current and bool(gpu.processes)
        geometry = Geometry.of(gpu) if gpu.mig_capable and gpu.profiles and not running else None
        sms = max((p.multiprocessor_count for p in gpu.profiles), default=0) or None
        # What clients can have: the total less what the driver holds (memory used beyond the
        # processes' own; 0.6 GiB on an idle H200).
        held = sum(p.memory_bytes or 0 for p in gpu.processes)
        reserved = max(gpu.memory_used_bytes - held, 0) if not gpu.mig_current else 0
        usable = (gpu.memory_total_bytes - reserved) // MIB
        total = gpu.memory_total_bytes // MIB
        return cls(gpu.index, total, sms, geometry, tuple(ids), idle, busy, usable)

    @property
    def usable(self) -> int:
        return self.usable_mib or self.memory_mib

    @property
    def key(self) -> tuple[object, ...]:
        """GPUs with equal keys have equal options."""
        return (
            self.memory_mib,
            self.usable_mib,
            self.sms,
            self.geometry,
            self.candidates,
            self.idle,
            self.busy,
        )

    def profile(self, profile_id: int) -> GiProfile:
        assert self.geometry is not None
        return self.geometry.profile(profile_id)


@dataclass(frozen=True)
class Option:
    """One way to fill a GPU. `detail`: MIG profile counts ((id, n), ...), MPS replicas, or the
    class a whole GPU holds."""

    mode: str  # mig | mps | whole | unused
    vec: Vec
    kept: int  # existing slices it keeps
    memory_mib: int  # memory of the slices it makes (MIG); the GPU's otherwise
    detail: tuple[tuple[int, int], ...] | int = ()

    def better_than(self, other: Option) -> bool:
        mine = (self.kept, -MODE_RANK.get(self.mode, 3), -self.memory_mib)
        theirs = (other.kept, -MODE_RANK.get(other.mode, 3), -other.memory_mib)
        return mine > theirs


@lru_cache(maxsize=64)
def all_layouts(geometry: Geometry, candidates: tuple[int, ...]) -> tuple[Layout, ...]:
    """Every valid layout (the empty one included) made of the `candidates` profiles."""
    insts = [i for pid in candidates for i in geometry.instances(geometry.profile(pid))]
    out: list[Layout] = []

    def grow(start: int, layout: Layout) -> None:
        out.append(layout)
        for j in range(start, len(insts)):
            if geometry.fits(layout, insts[j]):
                grow(j + 1, (*layout, insts[j]))

    grow(0, ())
    return tuple(out)


def fits_slice(d: Demand, profile: GiProfile, gpu_sms: int | None) -> bool:
    if d.isolation == "exclusive" or d.memory_mib > profile.memory_bytes // MIB:
        return False
    need = d.sms_on(gpu_sms)
    return need is not None and need <= profile.multiprocessor_count


def fits_whole(d: Demand, view: GpuView) -> bool:
    need = d.sms_on(view.sms)
    return (
        d.isolation != "mig"
        and d.memory_mib <= view.usable
        and need is not None
        and (need == 0 or (view.sms is not None and need <= view.sms))
    )


class TooLarge(Exception):
    """The exact search would take too long (many kinds of workloads, many MPS clients)."""


Signature = tuple[tuple[int, int], ...]  # (profile id, NEW | IDLE | BUSY) per slice, sorted


@lru_cache(maxsize=64)
def signatures(view: GpuView) -> tuple[Signature, ...]:
    """The layouts of the GPU that keep its slices in use, as profiles and what each slice is
    now (layouts alike in these hold the same replicas and keep as many slices)."""
    if view.geometry is None:
        return ()
    found: set[Signature] = set()
    for layout in all_layouts(view.geometry, view.candidates):
        if not view.busy <= set(layout):
            continue
        states = (BUSY if i in view.busy else IDLE if i in view.idle else NEW for i in layout)
        found.add(tuple(sorted(zip((i.profile_id for i in layout), states, strict=True))))
    return tuple(sorted(found))


def _sig_option(view: GpuView, sig: Signature, vec: Vec) -> Option:
    groups = Counter(sig)
    kept = sum(n for (_, state), n in groups.items() if state != NEW)
    memory = sum(view.profile(pid).memory_bytes // MIB * n for (pid, _), n in groups.items())
    counts: Counter[int] = Counter()
    for (pid, _), n in groups.items():
        counts[pid] += n
    return Option("mig", vec, kept, memory, tuple(sorted(counts.items())))


def mig_options(
    view: GpuView, demands: tuple[Demand, ...], cap: Vec, limit: int = 0
) -> dict[Vec, Option]:
    """The best MIG option (most existing slices kept, then least slice memory) for every
    vector of replicas, each at most `cap`, that some valid layout can hold. Raises TooLarge
    past `limit` (vectors times classes squared: the cost of the frontier; 0: no limit)."""
    pack = _Packing(cap)
    best: dict[int, Option] = {}  # by packed vector; the vector is filled in at the end
    for sig in signatures(view):
        like = _sig_option(view, sig, ())  # the layout's terms
        for state in _fill(view, demands, pack, Counter(sig), limit):
            other = best.get(state)
            if other is None or like.better_than(other):
                best[state] = like
        if limit and len(best) * len(demands) ** 2 > limit:
            raise TooLarge(f"too many ways to fill GPU {view.index} with MIG slices")
    out = {}
    for state, like in best.items():
        vec = pack.decode(state)
        out[vec] = Option("mig", vec, like.kept, like.memory_mib, like.detail)
    return out


def _fill(
    view: GpuView,
    demands: tuple[Demand, ...],
    pack: _Packing,
    groups: Counter[tuple[int, int]],
    limit: int = 0,
) -> set[int]:
    """Every vector the slices of `groups` can hold (new slices each hold one replica), at
    most `pack.cap`, packed.

    Vectors are packed into one integer each (`_Packing`), so that adding a group's
    replicas to every vector so far and dropping those past the cap is an integer sum and a
    mask test, not a loop over the coordinates (this was half of a plan's time)."""
    cap = pack.cap
    states = {pack.start}
    for (pid, state), n in sorted(groups.items()):
        profile = view.profile(pid)
        fit = [k for k, d in enumerate(demands) if fits_slice(d, profile, view.sms)]
        if limit and math.comb(len(fit) + n, n) * len(states) * len(demands) ** 2 > limit:
            raise TooLarge(f"too many ways to fill GPU {view.index} with MIG slices")
        sizes = (n,) if state == NEW else tuple(range(n + 1))
        key = (tuple(fit), sizes)
        adds = pack.adds.get(key)
        if adds is None:  # the same slices recur in many layouts
            adds = pack.adds[key] = set()
            for size in sizes:
                for combo in combinations_with_replacement(fit, size):
                    add = [0] * len(demands)
                    for k in combo:
                        add[k] += 1
                    if all(a <= c for a, c in zip(add, cap, strict=True)):
                        adds.add(pack.encode(add))
        guard = pack.guard
        states = {s + a for s in states for a in adds if not (s + a) & guard}
        if not states:
            return set()
    return states


class _Packing:
    """Vectors of replicas, each coordinate at most its cap, packed into an integer: field k
    holds v[k] + (2**(bits-1) - 1 - cap[k]), its top bit (the guard) clear exactly while
    v[k] <= cap[k]. Adding a packed vector whose coordinates are at most the caps never
    carries out of a field, so a sum is within the caps exactly when no guard bit is set."""

    def __init__(self, cap: Vec) -> None:
        self.cap = cap
        self.bits = max(cap, default=0).bit_length() + 1
        half = 1 << (self.bits - 1)
        self.offsets = tuple(half - 1 - c for c in cap)
        self.start = self.encode(self.offsets)
        self.guard = sum(half << (k * self.bits) for k in range(len(cap)))
        self.mask = (1 << self.bits) - 1
        self.adds: dict[tuple[tuple[int, ...], tuple[int, ...]], set[int]] = {}

    def encode(self, vec: Sequence[int]) -> int:
        return sum(v << (k * self.bits) for k, v in enumerate(vec))

    def decode(self, state: int) -> Vec:
        return tuple(
            ((state >> (k * self.bits)) & self.mask) - off for k, off in enumerate(self.offsets)
        )


def mig_greedy(view: GpuView, demands: tuple[Demand, ...], left: Vec) -> list[Option]:
    """One option per layout when there are too many to try: replicas by priority, then the
    largest first, each into the smallest free slice that fits it."""
    order = sorted(
        range(len(demands)), key=lambda k: (-demands[k].priority, -demands[k].memory_mib, k)
    )
    out = []
    for sig in signatures(view):
        free = sorted(
            sig,
            key=lambda s: (
                view.profile(s[0]).memory_bytes,
                view.profile(s[0]).multiprocessor_count,
            ),
        )
        vec = [0] * len(demands)
        used: list[tuple[int, int]] = []
        for k in order:
            if not free:
                break
            for _ in range(left[k]):
                slot = next(
                    (s for s in free if fits_slice(demands[k], view.profile(s[0]), view.sms)), None
                )
                if slot is None:
                    break
                free.remove(slot)
                used.append(slot)
                vec[k] += 1
        kept_new = tuple(sorted(used + [s for s in free if s[1] != NEW]))
        if any(vec) or kept_new:
            out.append(_sig_option(view, kept_new, tuple(vec)))
    return out


def _admitted(view: GpuView, demands: tuple[Demand, ...], replicas: int) -> list[tuple[int, int]]:
    """The classes an MPS client of this GPU can be, with their thread percentage."""
    pinned = view.usable // replicas
    admitted: list[tuple[int, int]] = []
    for k, d in enumerate(demands):
        pct = d.percent_on(view.sms)
        if d.isolation == "shared" and d.memory_mib <= pinned and pct is not None and pct <= 100:
            admitted.append((k, pct))
    return admitted


def mps_options(
    view: GpuView, demands: tuple[Demand, ...], cap: Vec, replicas: int, limit: int = 0
) -> dict[Vec, Option]:
    """Every vector of shared replicas one MPS GPU holds with `replicas` clients: each within
    the pinned limit memory // replicas, compute needs summing to at most 100 %. Raises
    TooLarge past `limit` (vectors times classes squared; 0: no limit)."""
    if view.busy:
        return {}
    admitted = _admitted(view, demands, replicas)
    out: dict[Vec, Option] = {}
    vec = [0] * len(demands)

    def grow(j: int, clients: int, percent: int) -> None:
        if clients:
            t = tuple(vec)
            out[t] = Option("mps", t, 0, view.memory_mib, replicas)
            if limit and len(out) * len(demands) ** 2 > limit:
                raise TooLarge(f"too many ways to share GPU {view.index} through MPS")
        for i in range(j, len(admitted)):
            k, pct = admitted[i]
            if clients < replicas and percent + pct <= 100 and vec[k] < cap[k]:
                vec[k] += 1
                grow(i, clients + 1, percent + pct)
                vec[k] -= 1

    grow(0, 0, 0)
    return out


def mps_greedy(
    view: GpuView, demands: tuple[Demand, ...], left: Vec, replicas: int
) -> Option | None:
    """One good MPS option when there are too many to try: clients by priority, then the
    largest first, as many as the slots and 100 % of the compute allow."""
    if view.busy:
        return None
    order = sorted(
        _admitted(view, demands, replicas),
        key=lambda a: (-demands[a[0]].priority, -demands[a[0]].memory_mib, a[0]),
    )
    vec = [0] * len(demands)
    slots, percent = replicas, 0
    for k, pct in order:
        room = (100 - percent) // pct if pct else slots
        n = min(left[k], slots, room)
        vec[k] += n
        slots, percent = slots - n, percent + n * pct
    if not any(vec):
        return None
    return Option("mps", tuple(vec), 0, view.memory_mib, replicas)


def whole_options(view: GpuView, demands: tuple[Demand, ...], cap: Vec) -> dict[Vec, Option]:
    """One exclusive (or shared) replica on the whole GPU, MIG off."""
    if view.busy:
        return {}
    out = {}
    for k, d in enumerate(demands):
        if cap[k] and fits_whole(d, view):
            vec = tuple(int(i == k) for i in range(len(demands)))
            out[vec] = Option("whole", vec, 0, view.memory_mib, k)
    return out


def merge(*tables: dict[Vec, Option]) -> dict[Vec, Option]:
    best: dict[Vec, Option] = {}
    for table in tables:
        for vec, option in table.items():
            if vec not in best or option.better_than(best[vec]):
                best[vec] = option
    return best


def frontier(options: dict[Vec, Option]) -> tuple[Vec, ...]:
    """The vectors no other option beats: none holds at least as much of every class while
    keeping at least as many existing slices. Any plan can be made of these, capped.

    The table is closed downwards (one replica fewer still fits, keeping as many slices), so a
    vector is beaten exactly when one more replica of some class is an option that keeps as
    many slices: a lookup per class instead of a comparison with every other option."""
    width = len(next(iter(options))) if options else 0
    front = []
    for vec, option in options.items():
        beaten = False
        for k in range(width):
            up = (*vec[:k], vec[k] + 1, *vec[k + 1 :])
            other = options.get(up)
            if other is not None and other.kept >= option.kept:
                beaten = True
                break
        if not beaten:
            front.append(option)
    front.sort(key=lambda o: (-sum(o.vec), -o.kept, o.vec))
    return tuple(o.vec for o in front)
