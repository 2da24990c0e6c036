"""Human-readable text for `nodeagent status`: a table per GPU and a picture of its slices."""

from __future__ import annotations

import string

from nodeagent.nvml.inventory import Gpu, Inventory, Process, Slice

GIB = 1024**3


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _mig_mode(gpu: Gpu) -> str:
    if not gpu.mig_capable:
        return "not supported"
    text = "enabled" if gpu.mig_current else "disabled"
    if gpu.mig_pending != gpu.mig_current:
        text += f" (pending: {'enabled' if gpu.mig_pending else 'disabled'}, needs a GPU reset)"
    return text


def slice_letters(gpu: Gpu) -> dict[tuple[int, int | None], str]:
    """A letter per slice, in placement order, for the picture and the table."""
    letters = string.ascii_uppercase
    return {(s.gi_id, s.ci_id): letters[i % 26] for i, s in enumerate(gpu.slices)}


def picture(gpu: Gpu) -> list[str]:
    """Two lines: the memory-slice numbers and which slice holds each ('.' = free)."""
    letters = slice_letters(gpu)
    cells = ["."] * gpu.memory_slice_count
    for s in gpu.slices:
        for slot in s.placement.slots():
            if 0 <= slot < len(cells):
                cells[slot] = letters[(s.gi_id, s.ci_id)]
    head = "".join(f"|{i:^3}" for i in range(gpu.memory_slice_count)) + "|"
    body = "".join(f"|{c:^3}" for c in cells) + "|"
    return [head, body]


def _processes(procs: tuple[Process, ...]) -> str:
    return ", ".join(f"{p.pid} ({_gib(p.memory_bytes)})" for p in procs) or "-"


def _slice_row(letter: str, s: Slice) -> str:
    ci = "-" if s.ci_id is None else str(s.ci_id)
    uuid = s.mig_uuid or "(no compute instance: incomplete slice)"
    mem = f"{_gib(s.memory_used_bytes)} / {_gib(s.memory_total_bytes)}"
    return (
        f"    {letter:<3}{s.device_profile:<12}{s.placement!s:<7}{s.gi_id:<4}{ci:<4}"
        f"{uuid:<42}{mem:<22}{s.multiprocessor_count:<5}{_processes(s.processes)}"
    )


def render_gpu(gpu: Gpu, sharing: str | None = None) -> list[str]:
    lines = [
        f"GPU {gpu.index}  {gpu.name}  {gpu.uuid}",
        f"  bus {gpu.pci_bus_id}  device id 0x{gpu.pci_device_id:08X}  {gpu.architecture}"
        f" (compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]})",
        f"  memory  {_gib(gpu.memory_total_bytes)} total, {_gib(gpu.memory_used_bytes)} used,"
        f" {_gib(gpu.memory_free_bytes)} free",
        f"  MIG     {_mig_mode(gpu)}",
    ]
    if sharing is not None:
        lines.append(f"  sharing {sharing}")
    if gpu.mig_current:
        pic = picture(gpu)
        lines += [f"  memory slices {pic[0]}", f"                {pic[1]}"]
        if gpu.slices:
            lines.append(
                f"    {'ID':<3}{'PROFILE':<12}{'PLACE':<7}{'GI':<4}{'CI':<4}{'MIG UUID':<42}"
                f"{'MEMORY USED / TOTAL':<22}{'SMS':<5}PROCESSES (PID, MEMORY)"
            )
            letters = slice_letters(gpu)
            lines += [_slice_row(letters[(s.gi_id, s.ci_id)], s) for s in gpu.slices]
        else:
            lines.append("    no slices")
    else:
        lines.append(f"  processes {_processes(gpu.processes)}")
    return lines


def render_inventory(inventory: Inventory, sharing: dict[int, str] | None = None) -> str:
    n = len(inventory.gpus)
    lines = [
        f"driver {inventory.driver_version}, CUDA {inventory.cuda_version},"
        f" {n} GPU{'s' if n != 1 else ''}"
    ]
    for gpu in inventory.gpus:
        lines.append("")
        lines += render_gpu(gpu, (sharing or {}).get(gpu.index))
    return "\n".join(lines) + "\n"
