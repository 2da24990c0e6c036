"""Helpers for MIG tests: GPUs of each emulated model with a given layout, and an
independent brute-force reference for the planner (its own rules, its own enumeration)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from itertools import count

from nodeagent.mig.select import MigTarget
from nodeagent.nvml import Gpu, NvmlSession, Placement, Process, Slice, read_inventory
from nodeagent.sim import SimulatedNvml

Candidate = tuple[int, int, int]  # (profile id, start, size)


@cache
def blank_gpu(model: str) -> Gpu:
    """A GPU of `model` with MIG enabled and no slices (read through the real nvml/ code)."""
    lib = SimulatedNvml([model])
    session = NvmlSession(lib)
    gpu = read_inventory(session).gpus[0]
    session.close()
    return replace(gpu, mig_current=True, mig_pending=True)


def gpu_with(model: str, layout: list[Candidate], busy: set[int] = frozenset()) -> Gpu:  # type: ignore[assignment]
    """`model` with one complete slice per candidate; those at indices in `busy` have a process."""
    base = blank_gpu(model)
    names = {p.id: p for p in base.profiles}
    slices = []
    ids = count(1)
    for i, (pid, start, size) in enumerate(layout):
        p = names[pid]
        slices.append(
            Slice(
                gpu_index=0,
                gi_id=next(ids),
                ci_id=0,
                profile_id=pid,
                profile=p.name,
                placement=Placement(start, size),
                mig_uuid=f"MIG-{i}",
                memory_total_bytes=p.memory_bytes,
                memory_used_bytes=0,
                multiprocessor_count=p.multiprocessor_count,
                processes=(Process(1000 + i, 1 << 20),) if i in busy else (),
            )
        )
    return replace(base, slices=tuple(slices))


def candidates(gpu: Gpu) -> list[Candidate]:
    return [(p.id, q.start, q.size) for p in gpu.profiles for q in p.placements]


def reference_valid(gpu: Gpu, layout: list[Candidate]) -> bool:
    """The hardware rules, written again independently of nodeagent.mig.geometry."""
    profiles = {p.id: p for p in gpu.profiles}
    used: set[int] = set()
    per: dict[int, int] = {}
    compute = me = 0
    max_compute = max(p.slice_count for p in gpu.profiles)
    for pid, start, size in layout:
        p = profiles[pid]
        if Placement(start, size) not in p.placements:
            return False
        cells = set(range(start, start + size))
        if cells & used:
            return False
        used |= cells
        per[pid] = per.get(pid, 0) + 1
        if per[pid] > p.instance_count:
            return False
        compute += p.slice_count
        me += p.name.endswith("+me")
    return compute <= max_compute and me <= 1


def all_valid_layouts(gpu: Gpu) -> list[frozenset[Candidate]]:
    """Every valid layout, by include/exclude over every candidate instance."""
    cands = candidates(gpu)
    out: list[frozenset[Candidate]] = []

    def walk(i: int, chosen: list[Candidate]) -> None:
        if i == len(cands):
            out.append(frozenset(chosen))
            return
        walk(i + 1, chosen)
        trial = [*chosen, cands[i]]
        if reference_valid(gpu, trial):
            walk(i + 1, trial)

    walk(0, [])
    return out


def counts_of(layout: frozenset[Candidate] | list[Candidate]) -> dict[int, int]:
    out: dict[int, int] = {}
    for pid, _, _ in layout:
        out[pid] = out.get(pid, 0) + 1
    return out


def brute_force_cost(
    layouts: list[frozenset[Candidate]],
    current: list[Candidate],
    busy: set[int],
    want: dict[int, int],
) -> int | None:
    """Fewest NVML mutations from `current` (complete slices) to `want`, keeping `busy`,
    over `layouts` (all_valid_layouts of the model)."""
    cur = set(current)
    must = {current[i] for i in busy}
    best = None
    for layout in layouts:
        if counts_of(layout) != want or not must <= layout:
            continue
        cost = 2 * len(cur - layout) + 2 * len(layout - cur)
        best = cost if best is None else min(best, cost)
    return best


def desired(counts: dict[int, int], enabled: bool = True) -> MigTarget:
    return MigTarget(0, enabled, counts, "test")
