"""The MPS share servers: one MPS control daemon per device and user group for the DRA share
claims on it. Who starts what: the DRA driver prepares a claim and calls the claims' one owner
of MPS daemons (nodeagent.mps.claims.ClaimDaemons), which starts, joins, stops and revives these
servers (and a claim's own daemon for an MpsConfig); the share watch's worker
(nodeagent.dra.sharewatch) asks it to start again a server that died. The device-plugin path's
daemon is another regime, the reconcile pipeline's (nodeagent.mps.manager); the two never run
on one GPU (nodeagent.mps.regimes: the later one is refused).

Three processes of one MPS daemon run concurrently; three daemons on one GPU are three CUDA
contexts that the GPU time-slices (measured on an H200: 2.05 s each against 6.59 s each for the
same work). So the share claims on one device (a GPU, or a MIG device for `dra.mps-shares:
mig`) are the clients of one daemon:

    <root>/<device name>-u<uid>/{pipe,log}

The first claim prepared on the device starts it; later claims join it; it stops after the
last of them goes. Each claim's limits reach its containers as client environment
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: its SM limit; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: its
memory; CUDA_MPS_CLIENT_PRIORITY: nodeagent.dra.cdi), which can only lower what the daemon
allows. The daemon's own limits are the **ceiling**: the largest limit among its claims
(threads and memory apart), set as its defaults and on every server it runs
(`set_active_thread_percentage <server>`, `set_device_pinned_mem_limit <server> 0`), and read
back. A client can never take more than the ceiling; one that rewrites its environment to ask
for more than its own limit (up to the ceiling) is what the claims' watch reports
(nodeagent.dra.watch).

An MPS server runs as one uid, and a client of another uid waits without a word until the
first uid's clients are gone. So the group (a uid) is part of the key: claims of different
users on one device get separate daemons, which the GPU time-slices against each other.

Which claims are the clients of which daemon is not kept here: the caller passes them in from
the DRA driver's one record of claims, so a restarted agent adopts each daemon as it finds it
(nothing is restarted under running clients) and sets the same ceiling again.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.base.errors import AgentError, MpsError
from nodeagent.base.files import read_regular
from nodeagent.base.logs import get_logger
from nodeagent.base.units import decimal
from nodeagent.mps.control import MpsControl, limit_holds, no_link, process_alive, removable
from nodeagent.mps.daemon import MpsDaemon
from nodeagent.mps.settings import Limits, MpsSettings, mps_size, parse_size

log = get_logger("nodeagent.mps")
CONTROL_LOG_BYTES = 16 << 20  # the daemon's log of one device's clients
_NEW_CLIENT = re.compile(r"NEW CLIENT ([0-9]{1,10}) from user ([0-9]{1,10})\b")  # ASCII only


@dataclass(frozen=True)
class ShareKey:
    """One share server: the device its clients see (`uuid`: a GPU's or a MIG device's, on GPU
    `gpu`), by its DRA device name (`device`), and the user its server runs as."""

    device: str
    gpu: int = field(compare=False)
    uuid: str = field(compare=False)  # a MIG device's is known once it is made
    group: int = 0

    @property
    def name(self) -> str:
        return f"{self.device}-u{self.group}"


@dataclass(frozen=True)
class ShareClient:
    """One claim among a server's clients, with its limits (its SM limit, not its request)."""

    claim: str  # the claim's UID
    thread_percentage: int
    pinned_memory_bytes: int | None = None


@dataclass(frozen=True)
class Ceiling:
    """What the daemon allows any one client: the largest limit among its claims."""

    thread_percentage: int
    pinned_memory_bytes: int | None

    @classmethod
    def of(cls, clients: Iterable[ShareClient]) -> Ceiling:
        clients = list(clients)
        if not clients:
            raise ValueError("a share server has at least one client")
        memory = [c.pinned_memory_bytes for c in clients]
        return cls(
            max(c.thread_percentage for c in clients),
            None if any(m is None for m in memory) else max(m for m in memory if m is not None),
        )


@dataclass(frozen=True)
class Server:
    """A running share server as the caller hands it to its claims' containers."""

    key: ShareKey
    pipe_dir: Path
    log_dir: Path
    ceiling: Ceiling
    pid: int | None = None


@dataclass(frozen=True)
class Stall:
    """A client of another user waiting behind a share server (the control log says so)."""

    key: ShareKey
    pid: int
    user: int


class ShareServers:
    """The share servers under `root`. Every call is made by one claim at a time per key (the
    DRA driver serialises a device's claims); the daemons outlive the agent."""

    def __init__(
        self, root: Path, control_binary: str = "nvidia-cuda-mps-control", timeout: float = 5.0
    ) -> None:
        self.root = root
        self.control_binary = control_binary
        self.timeout = timeout
        self.restarts: dict[str, int] = {}

    def where(self, key: ShareKey) -> Path:
        return self.root / key.name

    def _daemon(self, key: ShareKey, ceiling: Ceiling) -> MpsDaemon:
        root = self.where(key)
        settings = MpsSettings(
            devices=(key.gpu,), thread_percentage=ceiling.thread_percentage,
            pipe_dir=root / "pipe", log_dir=root / "log", ready_file=root / "ready",
            control_binary=self.control_binary, command_timeout_seconds=self.timeout,
        )  # fmt: skip
        pinned = {0: ceiling.pinned_memory_bytes} if ceiling.pinned_memory_bytes else {}
        return MpsDaemon(settings, Limits(ceiling.thread_percentage, pinned, key.uuid))

    def _control(self, key: ShareKey) -> MpsControl:
        root = self.where(key)
        return MpsControl(self.control_binary, root / "pipe", root / "log", self.timeout)

    def pid(self, key: ShareKey) -> int | None:
        return self._control(key).daemon_pid()

    def serve(self, key: ShareKey, clients: Sequence[ShareClient]) -> Server:
        """The key's daemon, serving `clients` (the claims on it, the one joining included):
        started, or adopted where it runs; its ceiling set to theirs and read back on the
        daemon and on every server it runs. Raises MpsError; a daemon this call started is
        stopped again when it fails."""
        ceiling = Ceiling.of(clients)
        no_link(self.where(key), "MPS share server folder", self.root.parent)
        daemon = self._daemon(key, ceiling)
        daemon.start()  # adopts a running daemon: its servers and clients keep running
        try:
            self._servers_to(daemon, ceiling)
        except AgentError:
            if len(clients) == 1:
                daemon.stop()
            raise
        log.info(
            "mps.share_server",
            server=key.name,
            clients=len(clients),
            ceiling_percent=ceiling.thread_percentage,
            ceiling_memory=ceiling.pinned_memory_bytes,
        )
        root = self.where(key)
        return Server(key, root / "pipe", root / "log", ceiling, daemon.control.daemon_pid())

    def _servers_to(self, daemon: MpsDaemon, ceiling: Ceiling) -> None:
        """A daemon's defaults apply to the servers it starts later: a server already running
        (clients connected) gets the ceiling itself, for its next clients."""
        control = daemon.control
        for server in control.server_pids():
            pct = ceiling.thread_percentage
            control.command(f"set_active_thread_percentage {server} {pct}")
            if ceiling.pinned_memory_bytes:
                size = mps_size(ceiling.pinned_memory_bytes)
                control.command(f"set_device_pinned_mem_limit {server} 0 {size}")
            got = control.command(f"get_active_thread_percentage {server}")
            problems = []
            if decimal(got) != float(pct):  # ASCII digits only: float() takes others
                problems.append(f"thread percentage {got!r}, wanted {pct}")
            if ceiling.pinned_memory_bytes:
                text = control.command(f"get_device_pinned_mem_limit {server} 0")
                try:
                    held = parse_size(text) if text else None
                except AgentError:
                    held = None
                if not limit_holds(held, ceiling.pinned_memory_bytes):
                    problems.append(f"pinned memory limit {text or 'unset'}, wanted {size}")
            if problems:
                raise MpsError(f"MPS server {server} kept other limits: " + "; ".join(problems))

    def leave(self, key: ShareKey, remaining: Sequence[ShareClient]) -> None:
        """A claim let go of the key's daemon: with no claim left it stops and its folders go;
        else its ceiling follows the claims still on it (for their next clients). Raises
        MpsError."""
        if remaining:
            if self.pid(key) is not None:
                try:  # a lower ceiling for the next clients: never a reason to fail the leave
                    self.serve(key, remaining)
                except AgentError as err:
                    log.warning("mps.share_ceiling_kept", server=key.name, error=str(err))
            return
        if removable(self.where(key), "MPS share server folder", self.root.parent):
            self._daemon(key, Ceiling(100, None)).stop()
            shutil.rmtree(self.where(key), ignore_errors=True)
        self.restarts.pop(key.name, None)
        log.info("mps.share_server_stopped", server=key.name)

    def revive(self, key: ShareKey, clients: Sequence[ShareClient]) -> bool:
        """Start the key's daemon again if it should run and does not (it crashed or was
        killed: its clients lost their server), with its ceiling; True when it did. A daemon
        that cannot be started is said, and tried again at the next call."""
        if not clients or self.pid(key) is not None:
            return False
        try:
            self.serve(key, clients)
        except AgentError as err:
            log.error("mps.share_server_restart_failed", server=key.name, error=str(err))
            return False
        self.restarts[key.name] = self.restarts.get(key.name, 0) + 1
        log.warning("mps.share_server_restarted", server=key.name, clients=len(clients))
        return True

    def stalls(self, key: ShareKey) -> list[Stall]:
        """Clients of another user than the key's that the control log shows connecting: the
        daemon holds them, silently, until the key's own clients are gone."""
        path = self.where(key) / "log" / "control.log"
        try:
            raw = read_regular(path, "the MPS control log", CONTROL_LOG_BYTES)
        except (AgentError, OSError):  # too long, or not a file: nothing to read of it
            return []
        text = (raw or b"").decode(errors="replace")
        waiting: dict[int, int] = {}
        for m in _NEW_CLIENT.finditer(text):
            pid, user = int(m.group(1)), int(m.group(2))
            if user != key.group and process_alive(pid):
                waiting[pid] = user
        return [Stall(key, pid, user) for pid, user in sorted(waiting.items())]

    def clients(self, key: ShareKey) -> list[int]:
        """The pids of the daemon's clients, as it lists them (none when it does not run)."""
        control = self._control(key)
        if control.daemon_pid() is None:
            return []
        try:
            servers = control.server_pids()
            return [c for s in servers for c in control.client_pids(s)]
        except AgentError:
            return []
