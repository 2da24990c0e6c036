"""Is an emulated node's state one the hardware could be in? The state file is checked with the
same rules the emulated NVML calls enforce (rules.py), so a hand-edited file cannot hold a GPU
instance where NVML would never have created one.
"""

from __future__ import annotations

from nodeagent.sim.models import MIB, DeviceModel, load_model
from nodeagent.sim.rules import ci_conflict, device_memory, gi_conflict, short_name
from nodeagent.sim.state import GiState, GpuState, ProcessState, SimState


def state_problems(state: SimState) -> list[str]:
    """Every way `state` breaks a hardware rule, one phrase each naming the GPU (empty: none)."""
    problems: list[str] = []
    for gpu in state.gpus:
        problems += _gpu_problems(gpu, load_model(gpu.model))
    problems += _uuid_problems(state)
    problems += _process_problems(state)
    return problems


def _gpu_problems(gpu: GpuState, model: DeviceModel) -> list[str]:
    problems: list[str] = []
    if gpu.gis and not gpu.mig_current:
        problems.append(f"GPU {gpu.index} has MIG instances while its MIG mode is off")
    elif gpu.gis and not gpu.mig_pending:
        problems.append(f"GPU {gpu.index} has MIG instances and a pending change to MIG off")
    placed: list[GiState] = []
    for gi in sorted(gpu.gis.values(), key=lambda g: g.id):
        where = f"GPU {gpu.index} GI {gi.id}"
        p = model.profile_by_id(gi.profile_id)
        if p is None:
            ids = ", ".join(str(q.id) for q in model.profiles)
            problems.append(
                f"{where} has profile id {gi.profile_id}, not one of the {model.key}'s ({ids})"
            )
            continue
        where += f" ({short_name(p)})"
        if (gi.start, gi.size) not in p.placements:
            allowed = ", ".join(f"{s}:{n}" for s, n in p.placements)
            problems.append(
                f"{where} has placement {gi.start}:{gi.size}, not one of the profile's ({allowed})"
            )
            continue
        conflict = gi_conflict(placed, model, p, gi.start)
        if conflict:
            problems.append(f"{where}: {conflict}")
            continue
        placed.append(gi)
        held = GiState(gi.id, gi.profile_id, gi.start, gi.size)
        for ci in sorted(gi.cis.values(), key=lambda c: c.id):
            conflict = ci_conflict(held, p.slice_count, ci.profile_id, ci.start)
            if conflict:
                problems.append(f"{where} CI {ci.id} in a {short_name(p)} instance: {conflict}")
            else:
                held.cis[ci.id] = ci
    return problems


def _uuid_problems(state: SimState) -> list[str]:
    seen: dict[str, str] = {}
    problems = []
    for gpu in state.gpus:
        owners = [(gpu.uuid, f"GPU {gpu.index}")]
        owners += [
            (ci.uuid, f"GPU {gpu.index} GI {gi.id} CI {ci.id}")
            for gi in gpu.gis.values()
            for ci in gi.cis.values()
        ]
        for uuid, owner in owners:
            if uuid in seen:
                problems.append(f"{owner} has the UUID {uuid} of {seen[uuid]}")
            seen.setdefault(uuid, owner)
    return problems


def _device_of(state: SimState, p: ProcessState) -> tuple[str, int] | str:
    """(where, memory it has) of the device a process runs on, or why it cannot run there."""
    if not 0 <= p.gpu < len(state.gpus):
        return f"process {p.pid} runs on GPU {p.gpu}, which does not exist"
    gpu = state.gpus[p.gpu]
    model = load_model(gpu.model)
    if (p.gi_id is None) != (p.ci_id is None):
        return f"process {p.pid} on GPU {p.gpu} names a GI or a CI, not both"
    if p.gi_id is None:
        if gpu.mig_current:
            return f"process {p.pid} runs on the whole GPU {p.gpu}, which has MIG enabled"
        total, reserved = device_memory(model, None)
        return f"GPU {p.gpu}", total - reserved
    where = f"GPU {p.gpu} GI {p.gi_id} CI {p.ci_id}"
    gi = gpu.gis.get(p.gi_id)
    profile = model.profile_by_id(gi.profile_id) if gi else None
    if gi is None or p.ci_id not in gi.cis or profile is None:
        return f"process {p.pid} runs on {where}, which does not exist"
    total, reserved = device_memory(model, profile)
    return where, total - reserved


def _process_problems(state: SimState) -> list[str]:
    problems = []
    pids: set[int] = set()
    used: dict[str, tuple[int, int]] = {}  # device -> (bytes used, bytes it has)
    for p in state.processes:
        if p.pid in pids:
            problems.append(f"pid {p.pid} runs twice")
        pids.add(p.pid)
        device = _device_of(state, p)
        if isinstance(device, str):
            problems.append(device)
            continue
        where, capacity = device
        used[where] = (used.get(where, (0, 0))[0] + p.memory_bytes, capacity)
    for where, (taken, capacity) in used.items():
        if taken > capacity:
            problems.append(
                f"processes on {where} use {taken // MIB} MiB of the {capacity // MIB} MiB it has"
            )
    return problems
