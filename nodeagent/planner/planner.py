"""From workloads and the node's GPUs to a plan: which GPU holds which replica, and how. Pure.

`plan_node(inventory, workloads)` reads only the Inventory (each GPU's profile table, memory,
and its existing slices: those in use are kept, the others preferably) and returns the
assignment, the per-GPU sharing it needs, and the report. `nodeagent.planner.render` writes the
sharing config (and the mig-parted config) from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent.mig.geometry import Instance, Layout
from nodeagent.mig.plan import choose_target, existing_instances
from nodeagent.mig.select import MigTarget
from nodeagent.nvml.inventory import Gpu, Inventory, Placement
from nodeagent.planner.options import MIB, Demand, GpuView, Option, fits_slice, fits_whole
from nodeagent.planner.search import Objective, solve
from nodeagent.planner.workloads import Workload


@dataclass(frozen=True)
class Placed:
    """One replica of a workload, where it runs."""

    workload: str
    replica: int  # 0-based
    gpu: int
    mode: str  # mig | mps | whole
    profile: str | None = None  # mig: the slice's profile
    placement: Placement | None = None  # mig: where the slice sits


@dataclass(frozen=True)
class GpuAssignment:
    gpu: int
    name: str
    strategy: str  # mig | mps | whole
    used: bool
    mig_devices: tuple[tuple[str, int], ...] = ()  # profile -> count (mig)
    pinned_mib: int | None = None  # mps: each client's limit
    memory_stranded_mib: int = 0
    sms_stranded: int = 0


@dataclass(frozen=True)
class NotPlaced:
    workload: str
    replicas: int  # how many of its replicas found no place
    reason: str


@dataclass(frozen=True)
class NodePlan:
    gpus: tuple[GpuAssignment, ...]
    placed: tuple[Placed, ...]
    not_placed: tuple[NotPlaced, ...]
    mps_replicas: int | None  # MPS clients per MPS GPU (daemon-wide); None: no MPS GPU
    thread_percentage: int | None  # daemon-wide; None: no compute need given
    objective: Objective
    exact: bool = True  # False: too large to search exactly; a greedy plan

    @property
    def gpus_used(self) -> int:
        return sum(g.used for g in self.gpus)

    @property
    def gpus_whole(self) -> tuple[int, ...]:
        return tuple(g.gpu for g in self.gpus if not g.used)

    @property
    def memory_stranded_bytes(self) -> int:
        return sum(g.memory_stranded_mib for g in self.gpus) * MIB

    @property
    def sms_stranded(self) -> int:
        return sum(g.sms_stranded for g in self.gpus)

    @property
    def uses_mps(self) -> bool:
        return any(g.strategy == "mps" for g in self.gpus)


def demand_classes(
    workloads: Sequence[Workload], percent_step: int = 1
) -> tuple[tuple[Demand, ...], list[list[Workload]]]:
    """Alike workloads (memory, compute, isolation, priority) become one class: the search
    runs over classes, the replicas go back to workloads in file order. `percent_step`: each
    MPS client's percentage is rounded up to a multiple of it (Demand.step)."""
    keys: dict[tuple[object, ...], int] = {}
    members: list[list[Workload]] = []
    for w in workloads:
        key = (w.memory_mib, w.compute, w.sms, w.isolation, w.priority)
        if key not in keys:
            keys[key] = len(members)
            members.append([])
        members[keys[key]].append(w)
    demands = tuple(
        Demand(
            ws[0].memory_mib, ws[0].compute, ws[0].sms, ws[0].isolation, ws[0].priority,
            sum(w.replicas for w in ws), percent_step,
        )
        for ws in members
    )  # fmt: skip
    return demands, members


def plan_node(
    inventory: Inventory, workloads: Sequence[Workload], percent_step: int = 1
) -> NodePlan:
    """The best plan for these workloads on this node (see nodeagent.planner.search). With a
    `percent_step` above 1 the MPS clients' compute needs count rounded up to a multiple of it
    (at least one step each), as the scheduler counts DRA shares."""
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    views = [GpuView.of(g) for g in gpus]
    demands, members = demand_classes(workloads, percent_step)
    solution = solve(views, demands)
    queues = [[(w.name, r) for w in ws for r in range(w.replicas)] for ws in members]
    clients = [sum(o.vec) for o in solution.options if o.mode == "mps"]
    # The fewest clients that hold the plan: the pinned limit (memory // clients) is larger.
    mps_replicas = max(2, *clients) if clients else None
    placed: list[Placed] = []
    assignments = []
    percent = 0
    for gpu, view, option in zip(gpus, views, solution.options, strict=False):
        replicas = []
        for k, n in enumerate(option.vec):
            replicas += [(k, *queues[k].pop(0)) for _ in range(n)]
        if option.mode == "mps":
            for k, _, _ in replicas:
                percent = max(percent, demands[k].percent_on(view.sms) or 0)
        assignment, where = _gpu(gpu, view, option, demands, replicas, mps_replicas)
        assignments.append(assignment)
        placed += where
    by_name = {w.name: w for w in workloads}
    not_placed = [
        NotPlaced(name, n, _why(by_name[name], demands[k], views, n))
        for k, queue in enumerate(queues)
        for name, n in _count(queue)
    ]
    uses_mps = any(a.strategy == "mps" for a in assignments)
    return NodePlan(
        tuple(assignments),
        tuple(sorted(placed, key=lambda p: (p.gpu, p.workload, p.replica))),
        tuple(not_placed),
        mps_replicas,
        (percent or None) if uses_mps else None,
        solution.objective,
        solution.exact,
    )


def _count(queue: list[tuple[str, int]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for name, _ in queue:
        counts[name] = counts.get(name, 0) + 1
    return list(counts.items())


def _gpu(
    gpu: Gpu,
    view: GpuView,
    option: Option,
    demands: tuple[Demand, ...],
    replicas: list[tuple[int, str, int]],
    mps_replicas: int | None,
) -> tuple[GpuAssignment, list[Placed]]:
    need = sum(demands[k].memory_mib for k, _, _ in replicas)
    needed_sms = sum(demands[k].sms_on(view.sms) or 0 for k, _, _ in replicas)
    gpu_sms = view.sms or 0
    stranded = view.memory_mib - need
    if option.mode == "unused":
        return GpuAssignment(gpu.index, gpu.name, "whole", False), []
    if option.mode == "whole":
        _k, name, r = replicas[0]
        a = GpuAssignment(gpu.index, gpu.name, "whole", True, (), None, stranded,
                          max(gpu_sms - needed_sms, 0) if needed_sms else 0)  # fmt: skip
        return a, [Placed(name, r, gpu.index, "whole")]
    if option.mode == "mps":
        assert mps_replicas is not None
        a = GpuAssignment(
            gpu.index, gpu.name, "mps", True, (), view.usable // mps_replicas, stranded,
            max(gpu_sms - needed_sms, 0) if needed_sms else 0,
        )  # fmt: skip
        return a, [Placed(name, r, gpu.index, "mps") for _, name, r in replicas]
    assert isinstance(option.detail, tuple) and view.geometry is not None
    counts = dict(option.detail)
    existing = existing_instances(gpu) if gpu.mig_current else []
    chosen = choose_target(view.geometry, MigTarget(gpu.index, True, counts, "plan"), existing)
    assert chosen is not None, "the search only picks layouts that exist"
    layout = chosen.layout
    slots = _match(view, layout, [demands[k] for k, _, _ in replicas], view.busy)
    where = []
    hosting_sms = 0
    for (_, name, r), slot in zip(replicas, slots, strict=False):
        inst = layout[slot]
        profile = view.profile(inst.profile_id)
        hosting_sms += profile.multiprocessor_count
        where.append(Placed(name, r, gpu.index, "mig", profile.name, inst.placement))
    names: dict[str, int] = {}
    for pid, n in sorted(counts.items()):
        names[view.profile(pid).name] = n
    a = GpuAssignment(gpu.index, gpu.name, "mig", True, tuple(names.items()), None, stranded,
                      max(gpu_sms - hosting_sms, 0))  # fmt: skip
    return a, where


def _match(
    view: GpuView, layout: Layout, wants: list[Demand], busy: frozenset[Instance]
) -> list[int]:
    """A slice for every replica (each fits its slice, one replica a slice): augmenting paths,
    most demanding replicas first, slices not in use before those in use."""
    order = sorted(range(len(wants)), key=lambda i: (-wants[i].memory_mib, i))
    slices = sorted(range(len(layout)), key=lambda s: (layout[s] in busy, s))
    owner: dict[int, int] = {}

    def fits(i: int, s: int) -> bool:
        inst = layout[s]
        return fits_slice(wants[i], view.profile(inst.profile_id), view.sms)

    def augment(i: int, seen: set[int]) -> bool:
        for s in slices:
            if s in seen or not fits(i, s):
                continue
            seen.add(s)
            if s not in owner or augment(owner[s], seen):
                owner[s] = i
                return True
        return False

    for i in order:
        found = augment(i, set())
        assert found, "the search only picks layouts that hold their replicas"
    slot_of = {i: s for s, i in owner.items()}
    return [slot_of[i] for i in range(len(wants))]


def _why(w: Workload, d: Demand, views: Sequence[GpuView], missing: int) -> str:
    """Why replicas of a workload found no place: too big for every place, or out of room."""
    places = 0
    for v in views:
        if v.geometry is not None:
            places += sum(fits_slice(d, v.profile(pid), v.sms) for pid in v.candidates)
        places += fits_whole(d, v)
    need = f"{w.memory_mib} MiB" + (f" and {d.sms} SMs" if d.sms else "")
    need += f" and {d.compute:g} of a GPU" if d.compute is not None else ""
    if not places:
        where = {
            "mig": "no MIG slice of this node's GPUs is that big",
            "exclusive": "no GPU of this node is that big",
            "shared": "no MIG slice or GPU of this node is that big",
        }[d.isolation]
        return f"too big: needs {need}; {where}"
    placed = w.replicas - missing
    return (
        f"out of capacity: {placed} of {w.replicas} replicas placed; the rest do not fit"
        " beside the workloads placed before them (higher priority first)"
    )
