"""What each MPS share claim was given and what it got: its SM request (what the scheduler
counts) and limit (its clients' ceiling), its memory request, the device memory its clients
use and, where NVML attributes SM use to MPS clients, the SMs they kept busy.

    nodeagent_dra_share_sm_request_percent{claim,namespace,device}      gauge
    nodeagent_dra_share_sm_limit_percent{claim,namespace,device}        gauge
    nodeagent_dra_share_memory_request_bytes{claim,namespace,device}    gauge
    nodeagent_dra_share_memory_used_bytes{claim,namespace,device}       gauge
    nodeagent_dra_share_sm_achieved_percent{claim,namespace,device}     gauge
    nodeagent_dra_share_held_below_request{claim,namespace,device}      gauge (1: a finding)

The share watch (nodeagent.dra.sharewatch) places each client of a share server on its claim
(its NODEAGENT_MPS_CLAIM) and publishes the claims through DraStats.set_shares, which joins
them here with the utilization sampler's values (nodeagent.state.sampling): a scrape calls no
NVML and reads what the last look published. A number that cannot be told is left out,
never guessed:

- memory used: absent while a client of the claim's server names no claim of it (any claim
  may have started it), or NVML does not say a client's memory;
- achieved: absent on a MIG device (NVML has no per-process utilization there), on a GPU
  whose per-process utilization NVML does not report, and on a GPU where a process that is
  no known MPS client (the MPS server, or a process outside the shares) had SM use in the
  sample: NVML then did not split the clients' work among them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from nodeagent.state.snapshot import Inventory, ProcessUtilization

LABELS = ["claim", "namespace", "device"]


@dataclass(frozen=True)
class ShareView:
    """One share claim's device as the share watch last saw it. `clients`: the pids of its
    server's clients that are this claim's; None when a client of the server could not be
    placed on a claim."""

    claim: str  # the claim's UID
    namespace: str
    name: str
    device: str
    gpu: int
    mig: bool
    request_percent: int
    limit_percent: int
    memory_request_bytes: int | None
    clients: tuple[int, ...] | None


@dataclass(frozen=True)
class ShareUsage:
    """A share claim and what its clients got (None: not known, see the module)."""

    view: ShareView
    memory_used_bytes: int | None
    achieved_percent: float | None


def process_memory(inventory: Inventory) -> dict[int, dict[int, int | None]]:
    """Per GPU, every compute process's used memory by pid, on the GPU and its MIG devices."""
    out: dict[int, dict[int, int | None]] = {}
    for g in inventory.gpus:
        on = out.setdefault(g.index, {})
        for p in [*g.processes, *(p for s in g.slices for p in s.processes)]:
            on[p.pid] = p.memory_bytes
    return out


def _used(pid: int, mps: Mapping[int, int | None], listed: Mapping[int, int | None]) -> int | None:
    """A client's memory: NVML's MPS list first, where it says; then the compute list; 0 for
    a client on neither (it holds none on the device); None where NVML does not say."""
    if mps.get(pid) is not None:
        return mps[pid]
    if pid in listed:
        return listed[pid]
    return None if pid in mps else 0


def _attributed(gpu: int, views: Sequence[ShareView], util: ProcessUtilization) -> bool:
    """Whether the GPU's per-process samples split SM use among MPS clients: every process
    with SM use in them is a known client (of NVML's MPS list or of a share)."""
    samples = util.by_gpu.get(gpu)
    if samples is None:
        return False
    clients = set(util.mps_clients.get(gpu, {}))
    for v in views:
        if v.gpu == gpu and v.clients is not None:
            clients.update(v.clients)
    return all(s.sm <= 0 or pid in clients for pid, s in samples.items())


def measure(
    views: Sequence[ShareView], util: ProcessUtilization, inventory: Inventory | None
) -> list[ShareUsage]:
    """What each share's clients got, from the sampler's values and the inventory's
    processes (the memory NVML's MPS list does not give)."""
    memory = process_memory(inventory) if inventory is not None else {}
    attributed = {g: _attributed(g, views, util) for g in {v.gpu for v in views}}
    out = []
    for v in views:
        used: int | None = None
        achieved: float | None = None
        if v.clients is not None:
            listed, mps = memory.get(v.gpu, {}), util.mps_clients.get(v.gpu, {})
            sizes = [_used(pid, mps, listed) for pid in v.clients]
            used = None if any(n is None for n in sizes) else sum(n or 0 for n in sizes)
            if not v.mig and attributed[v.gpu]:
                samples = util.by_gpu[v.gpu]
                achieved = 100.0 * sum(samples[p].sm for p in v.clients if p in samples)
        out.append(ShareUsage(v, used, achieved))
    return out


class ShareSource(Protocol):
    """What ShareCollector reads (nodeagent.metrics.dra.DraStats)."""

    def share_usage(self) -> tuple[Sequence[ShareUsage], frozenset[str]]: ...


class ShareCollector:
    """The share claims as the share watch last published them (DRA on only)."""

    name = "shares"

    def __init__(self, shares: ShareSource) -> None:
        self.shares = shares

    def collect(self) -> Iterator[Metric]:
        usage, below = self.shares.share_usage()
        if usage:  # no share claim: no families (as a destroyed slice stops appearing)
            yield from families(usage, below)


def families(usage: Sequence[ShareUsage], below: frozenset[str]) -> list[Metric]:
    """The families of `usage`; `below`: the claim UIDs held below their request now."""
    made = {
        key: GaugeMetricFamily(f"nodeagent_dra_share_{key}", text, labels=LABELS)
        for key, text in HELP.items()
    }
    for u in sorted(usage, key=lambda u: (u.view.namespace, u.view.name, u.view.device)):
        v = u.view
        labels = [v.name, v.namespace, v.device]
        values: Mapping[str, float | int | None] = {
            "sm_request_percent": v.request_percent,
            "sm_limit_percent": v.limit_percent,
            "memory_request_bytes": v.memory_request_bytes,
            "memory_used_bytes": u.memory_used_bytes,
            "sm_achieved_percent": u.achieved_percent,
            "held_below_request": int(v.claim in below) if u.achieved_percent is not None else None,
        }
        for key, value in values.items():
            if value is not None:
                made[key].add_metric(labels, value)
    return list(made.values())


HELP = {
    "sm_request_percent": "An MPS share claim's SM request: the percent of the device's SMs the"
    " scheduler counts for it.",
    "sm_limit_percent": "An MPS share claim's SM limit: the ceiling its clients' active thread"
    " percentage is set to (at least the request; 100: it may use the idle device).",
    "memory_request_bytes": "An MPS share claim's device memory (a hard limit: its clients'"
    " pinned device memory limit).",
    "memory_used_bytes": "Device memory the claim's MPS clients use (NVML); absent while a client"
    " of its server cannot be placed on a claim.",
    "sm_achieved_percent": "Percent of the device's sample period the claim's MPS clients kept"
    " SMs busy, summed over its clients (nvmlDeviceGetProcessUtilization, newest sample);"
    " absent where NVML does not attribute SM use to MPS clients.",
    "held_below_request": "1 while the claim's clients are held below its SM request as another"
    " claim on the device bursts past its own (the share watch's HeldBelowRequest); absent"
    " where achieved is.",
}
