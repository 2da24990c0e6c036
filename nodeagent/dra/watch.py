"""The share claims watched: what each client of a share server does, attributed to its claim.

A share server's limits are its ceiling (the largest limit on the device: nodeagent.mps.servers);
a claim's own limits are client environment, which a client can rewrite. So the driver looks
at every client the daemon lists, with NVML's per-process memory, and attributes each to its
claim by the NODEAGENT_MPS_CLAIM its CDI spec gave it (read from /proc/<pid>/environ, the
environment the process was started with). A claim is over its share when one of its clients

    asks for more threads      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE above the claim's SM limit
                               (not its request: a share may burst up to its limit), or unset
    asks for more memory       CUDA_MPS_PINNED_DEVICE_MEM_LIMIT above the claim's, or unset
    uses more memory           NVML's used memory of the process above the claim's memory share

A client that names no claim of its server (its environment was replaced) is counted on every
claim of the server, since any of them may have started it. Where NVML attributes SM use to
MPS clients (nodeagent.metrics.shares), a claim is also held below its request
(HeldBelowRequest) when its clients are busy yet get less than its request while another claim
on the GPU takes more than its own and the GPU is full: MPS limits are ceilings, nothing
reserves a request. A client of another user waiting behind the server
(nodeagent.mps.servers.Stall) is reported on the claims of the server it waits behind.
Pure: the readers come in as arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.base.errors import AgentError
from nodeagent.base.units import decimal
from nodeagent.dra.cdi import CLAIM_ENV
from nodeagent.metrics.shares import ShareUsage, ShareView
from nodeagent.mps.claims import ClaimLimits
from nodeagent.mps.control import proc_file, process_alive
from nodeagent.mps.servers import Stall
from nodeagent.mps.settings import parse_size
from nodeagent.state.held import PreparedDevice

WITHIN = "WithinShare"
OVER_THREADS = "OverThreadShare"
OVER_MEMORY = "OverMemoryShare"
RESTARTED = "ServerRestarted"
WAITING = "WaitingForOtherUser"
BELOW = "HeldBelowRequest"
BELOW_MARGIN_PERCENT = 5  # short of the request by more than one SM step (dra.capacity)
FULL_PERCENT = 90  # the shares on a GPU keep this much of it busy: no idle SMs to lend
CONDITION = "ShareLimits"  # the condition type in the claim's status.devices entry


@dataclass(frozen=True)
class Finding:
    """One claim's device as the watch found it; `pids`: the clients it is about."""

    claim: str
    device: str
    reason: str
    message: str
    pids: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.reason == WITHIN


def _pinned(text: str | None) -> int | None:
    """'0=8192M' (device 0's limit) -> bytes; None when unset or unreadable."""
    if not text:
        return None
    for part in text.split(","):
        device, _, size = part.partition("=")
        if device.strip() == "0" and size:
            try:
                return parse_size(size.strip())
            except Exception:  # an unreadable value limits nothing
                return None
    return None


def _percent(text: str | None) -> float | None:
    """A client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as ASCII digits ('25', '25.0'); None
    (no limit) for anything else, which float() would have read ('nan', '٢٥', '1e400')."""
    return decimal(text) if text else None


def _over(d: PreparedDevice, env: Mapping[str, str], used: int | None) -> tuple[str, str] | None:
    """Why one client of `d`'s claim is over the claim's limits (None: it is not)."""
    assert d.mps is not None
    limits = ClaimLimits.of(d.mps)
    ceiling = limits.limit_percent
    pct = _percent(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
    if pct is None or pct > ceiling:
        asked = "no limit" if pct is None else f"{pct:g} %"
        return OVER_THREADS, f"asks for {asked} of the SMs, its limit is {ceiling} %"
    memory = limits.memory_bytes
    if memory:
        pinned = _pinned(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
        if pinned is None or pinned > memory:
            asked = "no memory limit" if pinned is None else f"{pinned >> 20} MiB"
            return OVER_MEMORY, f"asks for {asked}, its share is {memory >> 20} MiB"
        if used is not None and used > memory:
            return OVER_MEMORY, f"uses {used >> 20} MiB, its share is {memory >> 20} MiB"
    return None


def findings(
    on: Sequence[tuple[str, PreparedDevice]],
    clients: Iterable[int],
    used: Mapping[int, int | None],
    environ: Callable[[int], Mapping[str, str] | None],
    stalls: Iterable[Stall] = (),
) -> list[Finding]:
    """One Finding per claim of one server (`on`: its claims and their share devices)."""
    devices = dict(on)
    bad: dict[str, list[tuple[int, str, str]]] = {}
    for pid in clients:
        env = environ(pid)
        if env is None:  # gone meanwhile
            continue
        claim = env.get(CLAIM_ENV)
        mine = [claim] if claim in devices else list(devices)
        for uid in mine:
            why = _over(devices[uid], env, used.get(pid))
            if why is not None:
                if claim not in devices:
                    why = (why[0], f"{why[1]} (it names no claim of this server)")
                bad.setdefault(uid, []).append((pid, *why))
    waiting = list(stalls)
    out = []
    for uid, d in on:
        if uid in bad:
            pids = tuple(p for p, _, _ in bad[uid])
            _, reason, text = bad[uid][0]
            message = f"client {pids[0]} {text}" + (
                f" ({len(pids) - 1} more)" if len(pids) > 1 else ""
            )
            out.append(Finding(uid, d.device, reason, message, pids))
        elif waiting:
            users = sorted({s.user for s in waiting})
            message = (
                f"client {waiting[0].pid} of user {users[0]} waits behind this MPS server (it"
                f" runs as user {waiting[0].key.group}); a runAsUser on its containers, or an"
                " MpsShare config with its user, gives it a server of its own"
            )
            out.append(Finding(uid, d.device, WAITING, message, tuple(s.pid for s in waiting)))
        else:
            out.append(Finding(uid, d.device, WITHIN, "every client keeps within the share"))
    return out


def environ_of(pid: int) -> dict[str, str] | None:
    """A process's environment as it was started (None: gone, or not ours to read)."""
    try:
        raw = proc_file(pid, "environ")
    except AgentError:  # not ours to read: nothing to attribute
        return None
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def share_views(
    on: Sequence[tuple[str, PreparedDevice]],
    clients: Iterable[int],
    environ: Callable[[int], Mapping[str, str] | None],
    claims: Mapping[str, tuple[str, str]],
    alive: Callable[[int], bool] = process_alive,
) -> list[ShareView]:
    """Each claim of one server (`on`) with its clients (by their NODEAGENT_MPS_CLAIM); no
    claim has clients known while one of the server's names none of them, or runs with an
    environment that cannot be read."""
    mine: dict[str, list[int]] = {uid: [] for uid, _ in on}
    placed = True
    for pid in clients:
        env = environ(pid)
        if env is None:  # gone meanwhile, or not ours to read
            placed = placed and not alive(pid)
            continue
        claim = env.get(CLAIM_ENV, "")
        if claim in mine:
            mine[claim].append(pid)
        else:
            placed = False
    out = []
    for uid, d in on:
        assert d.mps is not None
        limits = ClaimLimits.of(d.mps)
        namespace, name = claims.get(uid, ("", uid))
        view = ShareView(
            uid, namespace, name, d.device, d.gpu, d.is_mig, limits.request_percent,
            limits.limit_percent, limits.memory_bytes, tuple(mine[uid]) if placed else None,
        )  # fmt: skip
        out.append(view)
    return out


def held_below(usage: Sequence[ShareUsage]) -> dict[str, str]:
    """{claim UID: why} of the claims held below their request in this look (see above)."""
    by_gpu: dict[int, list[tuple[ShareUsage, float]]] = {}
    for u in usage:
        if u.achieved_percent is not None:
            by_gpu.setdefault(u.view.gpu, []).append((u, u.achieved_percent))
    out = {}
    for shares in by_gpu.values():
        if sum(a for _, a in shares) < FULL_PERCENT:
            continue
        for u, got in shares:
            v = u.view
            over = [(o.view, a) for o, a in shares if o is not u and a > o.view.request_percent]
            if 0 < got < v.request_percent - BELOW_MARGIN_PERCENT and over:
                o, took = max(over, key=lambda x: x[1] - x[0].request_percent)
                out[v.claim] = (
                    f"its clients got {got:.0f} % of the SMs, below its request of"
                    f" {v.request_percent} %, while claim {o.namespace}/{o.name} took {took:.0f} %"
                    f" (request {o.request_percent} %): MPS limits are ceilings, a request is"
                    " not reserved; a lower smLimit on the other claim, or priority low on it,"
                    " leaves this one room"
                )
    return out
