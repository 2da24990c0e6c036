"""The kubelet's prepares under way, each told when an unprepare of its claim comes.

A prepare reads its claim from the API server before it takes the claim's lock
(nodeagent.dra.node). An unprepare that came in between (the claim was deleted, or the kubelet
let go of it: it calls NodeUnprepareResources once the pod is gone) found nothing prepared and
answered done; the prepare then took the lock and prepared the claim after its unprepare, and
nothing would ever unprepare it: its slices, its MPS daemon and its record were left for a
claim that no longer existed. So a prepare takes a ticket before it reads the claim, and an
unprepare of the claim marks every ticket of it taken before: the prepare, once it holds the
claim's lock, finds its ticket marked and refuses (Superseded) with nothing prepared. The
kubelet asks again if a pod still needs the claim, and that prepare reads the claim anew.
Tickets live only while their prepare does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from nodeagent.base.errors import AgentError


class Superseded(AgentError):
    """An unprepare of the claim came while this prepare was under way: nothing prepared."""

    retry = True  # the kubelet asks again if a pod still needs the claim
    reason = "superseded"  # a race the kubelet ends, not a fault (nodeagent_dra_refusals_total)


class Ticket:
    """One prepare under way; `unprepared` once an unprepare of its claim came."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.unprepared = False


class InFlight:
    """The prepares under way, by claim UID. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, set[Ticket]] = {}

    @contextmanager
    def prepare(self, uid: str) -> Iterator[Ticket]:
        """A ticket for a prepare of `uid`, held while inside."""
        ticket = Ticket(uid)
        with self._lock:
            self._open.setdefault(uid, set()).add(ticket)
        try:
            yield ticket
        finally:
            with self._lock:
                tickets = self._open.get(uid, set())
                tickets.discard(ticket)
                if not tickets:
                    self._open.pop(uid, None)

    def unprepared(self, uid: str) -> None:
        """An unprepare of `uid` begins: every prepare of it under way now is superseded."""
        with self._lock:
            for ticket in self._open.get(uid, ()):
                ticket.unprepared = True
