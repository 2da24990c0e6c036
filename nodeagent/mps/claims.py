"""The DRA claims' MPS daemons, behind one owner (ClaimDaemons): the share servers of the share
claims (nodeagent.mps.servers: one daemon per device and user, its clients the claims on it) and
the per-claim daemon of a claim with an MpsConfig (<plugin dir>/mps/<claim uid>/<device>).
The DRA driver (nodeagent.dra.node.NodeDriver) calls it as it prepares and unprepares claims
and passes in which claims share a server, read from its one record of claims; the share
watch (nodeagent.dra.sharewatch) asks it to start again a server that died. The pipeline's
daemon of the device-plugin path (nodeagent.mps.manager) is the other regime; the two exclude
each other on a GPU (nodeagent.mps.regimes).

A claim's limits are one typed value, ClaimLimits, read once from the record's `mps` entry:

    request_percent   the SMs the scheduler counted (a share's consumed `sm`; an MpsConfig's
                      threadPercentage)
    limit_percent     its clients' SM ceiling (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): a share's
                      smLimit (default 100: it bursts into the idle GPU); a record without one
                      (written before limits existed) keeps its request as its ceiling
    memory_bytes      its clients' pinned device memory limit: hard, equal to the request
    priority          normal | low (CUDA_MPS_CLIENT_PRIORITY 0 | 1): a hint to the MPS server
    user              the uid its share server runs as
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.base.errors import AgentError, MpsError
from nodeagent.base.files import entry_of
from nodeagent.base.logs import get_logger
from nodeagent.mps.control import no_link, removable
from nodeagent.mps.daemon import MpsDaemon
from nodeagent.mps.regimes import MpsRegimes
from nodeagent.mps.servers import ShareClient, ShareKey, ShareServers
from nodeagent.mps.settings import Limits, MpsSettings, validate
from nodeagent.nvml import Inventory

SHARES_DIR = "mps-shared"  # <plugin dir>/mps-shared/<device>-u<uid>/{pipe,log}: share servers
OWN_DIR = "mps"  # <plugin dir>/mps/<claim uid>/<device>/{pipe,log}: a claim's own daemon
CLIENT_PRIORITY = {"normal": 0, "low": 1}  # CUDA_MPS_CLIENT_PRIORITY

log = get_logger(__name__)


@dataclass(frozen=True)
class ClaimLimits:
    """What one claim's clients get of one device (module docstring)."""

    request_percent: int
    limit_percent: int
    memory_bytes: int | None = None
    priority: str = "normal"
    user: int = 0

    @classmethod
    def of(cls, mps: Mapping[str, Any]) -> ClaimLimits:
        """The limits of a recorded device's `mps` entry (written by the driver)."""
        request = int(mps["thread_percentage"])
        limit = mps.get("sm_limit_percent")
        memory = mps.get("pinned_memory_bytes")
        priority = mps.get("priority")
        return cls(
            request,
            request if limit is None else int(limit),
            int(memory) if memory else None,
            priority if priority in CLIENT_PRIORITY else "normal",
            int(mps.get("user") or 0),
        )

    @property
    def client_priority(self) -> int:
        return CLIENT_PRIORITY[self.priority]

    def client(self, claim: str) -> ShareClient:
        """The claim among its server's clients: the server's ceiling counts its limit."""
        return ShareClient(claim, self.limit_percent, self.memory_bytes)


@dataclass(frozen=True)
class ClaimDevice:
    """One MPS device of a claim, as its daemon needs it: the device its clients see (`uuid`:
    the GPU's, or the MIG device's once made), whether it is a share device, its limits."""

    claim: str  # the claim's UID
    device: str  # the DRA device name
    gpu: int
    uuid: str
    is_mig: bool
    shared: bool
    limits: ClaimLimits

    @property
    def key(self) -> ShareKey:
        """Its share server: the device, and the user its clients run as."""
        return ShareKey(self.device, self.gpu, self.uuid, self.limits.user)


_OWN = "MPS daemon folder"
Mates = Callable[[ShareKey], list[ClaimDevice]]  # the claims on a server now, under its lock


class ClaimDaemons:
    """The claims' MPS daemons under `plugin_dir`. A share server's calls are serialised per
    server; the daemons outlive the agent (a restarted one adopts them)."""

    def __init__(
        self, plugin_dir: Path, control_binary: str, regimes: MpsRegimes | None = None
    ) -> None:
        self.plugin_dir = plugin_dir
        self.control_binary = control_binary
        self.servers = ShareServers(plugin_dir / SHARES_DIR, control_binary)
        self.regimes = regimes or MpsRegimes()
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}  # one claim at a time per server
        # Per server, the (claim, device) that left it and the record still has (its entry
        # goes after its slices): two claims letting go at once must not each count the other.
        self._left: dict[str, set[tuple[str, str]]] = {}

    @contextmanager
    def _held(self, key: ShareKey) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(key.name, threading.Lock())
        with lock:
            yield

    def _on(self, key: ShareKey, mates: Mates) -> list[ClaimDevice]:
        """The claims on the server now (under its lock): the record's, less those that left
        it (forgotten once the record has them no more)."""
        recorded = mates(key)
        left = self._left.get(key.name, set()) & {(m.claim, m.device) for m in recorded}
        self._left[key.name] = left
        return [m for m in recorded if (m.claim, m.device) not in left]

    def claim_dir(self, claim: str) -> Path:
        """A claim's own daemons' folders: <plugin dir>/mps/<claim uid>."""
        return self.plugin_dir / OWN_DIR / claim

    def checked_claim_dir(self, claim: str) -> Path | None:
        """claim_dir, to be removed: a UID that names one entry of <plugin dir>/mps, with no
        symbolic link between the plugin directory and it (an rmtree would follow one); None
        when a link is there with nothing behind it (nothing to remove). Raises MpsError (a
        link with something behind it), ConfigError (a UID that is no one name)."""
        folder = entry_of(self.plugin_dir / OWN_DIR, claim, "the claim UID")
        return folder if removable(folder, "claim's MPS folder", self.plugin_dir) else None

    def adopt(self, keys: Iterable[ShareKey]) -> None:
        """The share servers the record has (an agent restart): their GPUs are theirs."""
        for key in keys:
            self.regimes.adopt(key.gpu, key.name)

    def start(self, dev: ClaimDevice, mates: Mates, inventory: Inventory) -> dict[str, str]:
        """The claim's daemon for `dev` started (a share: its server started or joined, its
        ceiling the largest limit of its claims, `mates` and this one); returns what goes into
        the device's record (`pipe_dir`, a share's `server`). Raises MpsError (a share server
        beside the pipeline's daemon, a limit the daemon did not keep), ConfigError."""
        if not dev.shared:
            root = self.claim_dir(dev.claim) / dev.device
            no_link(root, _OWN, self.plugin_dir)
            what = f"the DRA MPS daemon of device {dev.device} (claim UID {dev.claim})"
            self.regimes.claim_daemon(dev.gpu, _uuid(inventory, dev.gpu), what)
            self._own(dev, root, inventory).start()  # adopts the daemon of an earlier try
            return {"pipe_dir": str(root / "pipe")}
        key = dev.key
        with self._held(key):
            self._left.get(key.name, set()).discard((dev.claim, dev.device))
            on = self._on(key, mates)
            others = [m.limits.client(m.claim) for m in on if m.claim != dev.claim]
            self.regimes.share(key.gpu, key.name, _uuid(inventory, key.gpu))
            try:
                server = self.servers.serve(key, [*others, dev.limits.client(dev.claim)])
            except AgentError:
                if not others:
                    self.regimes.share_gone(key.name)
                raise
        return {"pipe_dir": str(server.pipe_dir), "server": key.name}

    def stop(self, dev: ClaimDevice, mates: Mates) -> None:
        """The claim lets go of its daemon for `dev`: its own stops; a share server stops
        after its last claim (else its ceiling follows the claims left). Raises MpsError."""
        if not dev.shared:
            if removable(self.claim_dir(dev.claim) / dev.device, _OWN, self.plugin_dir):
                self._stopper(dev).stop()
            return
        key = dev.key
        with self._held(key):
            on = self._on(key, mates)
            self._left.setdefault(key.name, set()).add((dev.claim, dev.device))
            remaining = [m.limits.client(m.claim) for m in on if m.claim != dev.claim]
            self.servers.leave(key, remaining)
            if not remaining:
                self.regimes.share_gone(key.name)

    def pid(self, dev: ClaimDevice) -> int | None:
        """The pid of the daemon serving `dev` (None: none runs)."""
        if dev.shared:
            return self.servers.pid(dev.key)
        return self._stopper(dev).control.daemon_pid()

    def revive(self, keys: Iterable[ShareKey], mates: Mates) -> list[tuple[str, str]]:
        """Each share server of `keys` that should run and does not (crashed, killed) started
        again with its ceiling; returns the (claim UID, device) of the claims it serves.
        `mates` is read under the server's lock, only for a server that does not run: the
        claims it serves then (a caller's earlier read may hold claims gone since, or lack one
        prepared since, whose limit is the ceiling)."""
        out: list[tuple[str, str]] = []
        for key in keys:
            with self._held(key):
                if self.servers.pid(key) is not None:
                    continue  # it runs: nothing to read
                on = self._on(key, mates)
                if not on:
                    continue
                try:  # its GPU is a share server's again, unless the pipeline's daemon took it
                    self.regimes.share(key.gpu, key.name)
                except MpsError as err:
                    log.error("mps.share_server_not_restarted", server=key.name, error=str(err))
                    continue
                if self.servers.revive(key, [m.limits.client(m.claim) for m in on]):
                    out += [(m.claim, m.device) for m in on]
        return out

    def _stopper(self, dev: ClaimDevice) -> MpsDaemon:
        """A claim's own daemon, as far as asking for its pid or stopping it goes."""
        root = self.claim_dir(dev.claim) / dev.device
        return MpsDaemon(self._settings(dev, root), Limits(100, {}, dev.uuid))

    def _settings(self, dev: ClaimDevice, root: Path, pinned: str | None = None) -> MpsSettings:
        return MpsSettings(
            devices=(dev.gpu,), thread_percentage=dev.limits.limit_percent,
            pinned_memory={dev.gpu: pinned} if pinned else {},
            pipe_dir=root / "pipe", log_dir=root / "log", ready_file=root / "ready",
            control_binary=self.control_binary,
        )  # fmt: skip

    def _own(self, dev: ClaimDevice, root: Path, inventory: Inventory) -> MpsDaemon:
        """A claim's own MPS control daemon for `dev`, with its limits (its MpsConfig's).
        Raises ConfigError."""
        memory, pct = dev.limits.memory_bytes, dev.limits.limit_percent
        if dev.is_mig:  # the daemon sees that MIG device only
            pinned = {0: memory} if memory else {}
            return MpsDaemon(self._settings(dev, root), Limits(pct, pinned, dev.uuid))
        settings = self._settings(dev, root, f"{memory >> 20}M" if memory else None)
        limits = validate(settings, inventory)
        if not memory:  # no limit asked: none set (validate's default is memory / replicas)
            limits = Limits(limits.thread_percentage, {}, limits.visible_devices)
        return MpsDaemon(settings, limits)


def _uuid(inventory: Inventory, gpu: int) -> str:
    """GPU `gpu`'s UUID ('' when the inventory has no such GPU)."""
    return next((g.uuid for g in inventory.gpus if g.index == gpu), "")


__all__ = ["ClaimDaemons", "ClaimDevice", "ClaimLimits", "Mates"]
