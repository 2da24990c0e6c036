"""The share servers kept and watched, every WATCH_SECONDS by a worker of their own (the
agent's `dra-shares`, beside the slice publisher's `dra-publish`; nodeagent.dra.watch says what
is looked at): a server that died is started again (nodeagent.dra.node.NodeDriver.check_shares),
and each share claim's state goes, when it changes, into

    its status.devices entry   condition ShareLimits: True WithinShare, or False with the reason
                               (OverThreadShare, OverMemoryShare, ServerRestarted,
                               WaitingForOtherUser, HeldBelowRequest) and one sentence naming
                               the client (or the claim that took its SMs)
    an Event on the claim      Warning when it goes over (or its server restarted), Normal back
    the metrics                nodeagent_dra_share_findings_total{reason},
                               nodeagent_dra_shares_over_limit (claims now over),
                               nodeagent_dra_share_held_below_request{claim} (and each
                               share's request, limit and use: nodeagent.metrics.shares)

With `dra.mps-share-enforce: end-client` a client over its claim's share is also ended
(SIGKILL: an MPS client cannot be asked to give back SMs or memory); `report` (the default)
only says so. The claims on other servers are never touched.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.dra.watch import (
    BELOW,
    OVER_MEMORY,
    OVER_THREADS,
    RESTARTED,
    WITHIN,
    Finding,
    environ_of,
    findings,
    held_below,
    share_views,
)
from nodeagent.metrics.shares import ShareUsage, ShareView, process_memory
from nodeagent.mps.servers import ShareKey
from nodeagent.nvml import Inventory
from nodeagent.state.held import PreparedClaim, PreparedDevice

log = get_logger("nodeagent.dra")
WATCH_SECONDS = 2.0  # a claim over its share is said within this (and the write's time)
RESTART_HOLD_SECONDS = 60.0  # how long ServerRestarted stays on a claim
BELOW_LOOKS = 3  # HeldBelowRequest is said after this many looks in a row find it
ENFORCE = ("report", "end-client")


class Reports(Protocol):
    def share(
        self, ref: ClaimRef, device: str, ok: bool, reason: str, message: str, deadline: float
    ) -> bool: ...


class Events(Protocol):
    def claim_event(
        self, namespace: str, name: str, uid: str, reason: str, message: str, kind: str
    ) -> None: ...


class Counts(Protocol):
    def share_finding(self, reason: str) -> None: ...
    def set_shares_over(self, count: int) -> None: ...
    def set_shares(self, views: list[ShareView], inventory: Inventory) -> list[ShareUsage]: ...
    def set_shares_below(self, claims: frozenset[str]) -> None: ...


@dataclass
class ShareWatch:
    node: NodeDriver
    reports: Reports | None = None
    events: Events | None = None
    stats: Counts | None = None
    enforce: Callable[[], str] = lambda: "report"
    clock: Callable[[], float] = time.monotonic
    kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL)
    said: dict[tuple[str, str], str] = field(default_factory=dict)  # reason last written
    restarted: dict[tuple[str, str], float] = field(default_factory=dict)
    below: dict[str, int] = field(default_factory=dict)  # claim UID -> looks in a row
    _next: float = 0.0

    def tick(self, inventory: Inventory | None = None) -> list[Finding]:
        """At most every WATCH_SECONDS: keep the servers up, look at their clients (with
        `inventory`'s per-process memory; None: read from NVML now, only while there are share
        claims), say what changed. Never raises (a failure is logged and tried at the next
        tick)."""
        now = self.clock()
        if now < self._next:
            return []
        self._next = now + WATCH_SECONDS
        try:
            claims = self.node.recorded()  # the record, read once a tick
            servers = self.node.share_clients(claims)  # and the servers it wants, once
            if inventory is None:
                if not servers and not self.said:
                    return []
                inventory = self.node.inventory()
            return self._tick(inventory, now, claims, servers)
        except AgentError as err:
            log.warning("dra.share_watch_failed", error=str(err))
            return []

    def _tick(
        self,
        inventory: Inventory,
        now: float,
        recorded: Mapping[str, PreparedClaim],
        servers: Mapping[ShareKey, list[tuple[str, PreparedDevice]]],
    ) -> list[Finding]:
        for uid, device in self.node.check_shares(servers):
            self.restarted[(uid, device)] = now
        serving = {(uid, d.device) for on in servers.values() for uid, d in on}
        self.restarted = {k: t for k, t in self.restarted.items() if k in serving}  # gone ones
        used = process_memory(inventory)  # by GPU, then pid
        claims = self.node.prepared_claims(recorded)
        out: list[Finding] = []
        views: list[ShareView] = []
        environ = functools.cache(environ_of)  # one read a client a look, for both uses
        for key, on in servers.items():
            pids = self.node.shares.clients(key)
            stalls = self.node.shares.stalls(key)
            views += share_views(on, pids, environ, claims)
            for f in findings(on, pids, used.get(on[0][1].gpu, {}), environ, stalls):
                since = self.restarted.get((f.claim, f.device))
                if since is not None and now - since > RESTART_HOLD_SECONDS:
                    del self.restarted[(f.claim, f.device)]
                elif since is not None and f.ok:
                    f = Finding(f.claim, f.device, RESTARTED, "its MPS server died and was"
                                " started again: its clients lost their server")  # fmt: skip
                out.append(f)
        out = self._below(out, views, inventory)
        for f in out:
            self._say(f, claims.get(f.claim))
        if self.stats is not None:
            self.stats.set_shares_over(sum(1 for f in out if not f.ok and f.reason != BELOW))
        live = {(f.claim, f.device) for f in out}
        for gone in set(self.said) - live:
            del self.said[gone]
        return out

    def _below(
        self, out: list[Finding], views: list[ShareView], inventory: Inventory
    ) -> list[Finding]:
        """The claims within their share but held below their request for BELOW_LOOKS looks
        in a row, as HeldBelowRequest (the metrics get the views measured)."""
        if self.stats is None:
            return out
        found = held_below(self.stats.set_shares(views, inventory))
        self.below = {uid: self.below.get(uid, 0) + 1 for uid in found}
        said = {uid for uid, n in self.below.items() if n >= BELOW_LOOKS}
        self.stats.set_shares_below(frozenset(said))
        return [
            Finding(f.claim, f.device, BELOW, found[f.claim]) if f.ok and f.claim in said else f
            for f in out
        ]

    def _say(self, f: Finding, claim: tuple[str, str] | None) -> None:
        if f.reason in (OVER_THREADS, OVER_MEMORY) and self.enforce() == "end-client":
            for pid in f.pids:
                try:
                    self.kill(pid)
                    log.warning("dra.share_client_ended", claim=f.claim, pid=pid, why=f.message)
                except OSError:
                    pass
        if self.said.get((f.claim, f.device)) == f.reason:
            return
        first = (f.claim, f.device) not in self.said
        if first and f.ok:  # nothing to say of a claim that was always within its share
            self.said[(f.claim, f.device)] = f.reason
            return
        self.said[(f.claim, f.device)] = f.reason
        if self.stats is not None and not f.ok:
            self.stats.share_finding(f.reason)
        level = log.info if f.ok else log.warning
        level("dra.share", claim=f.claim, device=f.device, reason=f.reason, message=f.message)
        if claim is None:
            return
        namespace, name = claim
        ref = ClaimRef(namespace, name, f.claim)
        if self.reports is not None:
            self.reports.share(ref, f.device, f.ok, f.reason, f.message, self.clock() + 5)
        if self.events is not None:
            try:
                self.events.claim_event(
                    namespace, name, f.claim, f.reason, f"{f.device}: {f.message}",
                    "Normal" if f.ok else "Warning",
                )  # fmt: skip
            except AgentError as err:
                log.debug("dra.share_event_failed", claim=f.claim, error=str(err))


__all__ = ["ENFORCE", "WITHIN", "ShareWatch"]
