"""The driver's report on each claim it prepares: the claim's `status.devices` entries
(nodeagent.dra.status) written to the API server after a prepare, and removed at unprepare.

A report never fails the call it reports on: a write that fails (the API server down, the
write refused) is counted (nodeagent_dra_status_writes_total{result="failure"}) and said once,
a warning `dra.status_write_failed`, until a write succeeds again (`dra.status_write_restored`).
Each write has its own share of the kubelet's deadline (at most STATUS_SECONDS, and never past
the deadline), so the kubelet hears the prepare's answer in time whatever the API server does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from nodeagent.base.errors import AgentError, DeadlineExceeded
from nodeagent.base.logs import get_logger
from nodeagent.dra.claims import ClaimRef, checked_claim
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.node import Prepared
from nodeagent.dra.status import (
    binding_entries,
    failed_entries,
    merged,
    now_rfc3339,
    ready_entries,
    share_condition,
    with_condition,
)
from nodeagent.dra.watch import CONDITION as SHARE_CONDITION

log = get_logger("nodeagent.dra")
# A status write's budget, retries included: a report, so it takes little of the kubelet's 45 s
# (the prepare is done; an API server that cannot answer in this long is down).
STATUS_SECONDS = 5.0
# An unprepare's removal: shorter still (deallocation drops the entries too: the API server
# removes a device's status with its allocation).
CLEAR_SECONDS = 1.0
MIN_SECONDS = 0.1  # less than this left before the deadline: not tried


class Counts(Protocol):
    def status_written(self, ok: bool) -> None: ...


class StatusReports:
    """Writes and removes this driver's entries in claims' status.devices."""

    def __init__(
        self,
        api: DraApi,
        driver: str,
        pool: str,
        stats: Counts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.driver = driver
        self.pool = pool
        self.stats = stats
        self.clock = clock
        self._lock = threading.Lock()
        self._failing = False

    def prepared(
        self, ref: ClaimRef, claim: dict[str, Any], made: Sequence[Prepared], deadline: float
    ) -> None:
        """Ready True for each prepared device, with what was made. `claim` as read for the
        prepare (read again only on a conflict)."""
        data = {p.device: p.data for p in made}
        now = now_rfc3339()

        def devices(current: Mapping[str, Any]) -> list[dict[str, Any]] | None:
            wanted = ready_entries(self.driver, self.pool, current, data, now)
            return merged(current, self.driver, wanted)

        self._write(ref, devices, deadline, STATUS_SECONDS, claim)

    def failed(self, ref: ClaimRef, claim: dict[str, Any], error: str, deadline: float) -> None:
        """Ready False for each of the claim's devices on this node, the error its message."""
        now = now_rfc3339()

        def devices(current: Mapping[str, Any]) -> list[dict[str, Any]] | None:
            wanted = failed_entries(self.driver, self.pool, current, error, now)
            return merged(current, self.driver, wanted)

        self._write(ref, devices, deadline, STATUS_SECONDS, claim)

    def binding(
        self,
        ref: ClaimRef,
        claim: dict[str, Any],
        made: Mapping[str, Mapping[str, Any]] | None,
        error: str,
        deadline: float,
    ) -> bool:
        """The binding conditions of the devices the scheduler waits on (made: True; None:
        the failure condition, `error` its message); True when the claim holds them now."""
        now = now_rfc3339()

        def devices(current: Mapping[str, Any]) -> list[dict[str, Any]] | None:
            wanted = binding_entries(self.driver, self.pool, current, made, error, now)
            return merged(current, self.driver, wanted)

        return self._write(ref, devices, deadline, STATUS_SECONDS, claim)

    def cleared(self, ref: ClaimRef, deadline: float) -> None:
        """The driver's entries removed (unprepare): the claim read, written only where it has
        some; a claim gone or replaced has none."""

        def devices(current: Mapping[str, Any]) -> list[dict[str, Any]] | None:
            return merged(current, self.driver, [])

        self._write(ref, devices, deadline, CLEAR_SECONDS, None)

    def share(
        self, ref: ClaimRef, device: str, ok: bool, reason: str, message: str, deadline: float
    ) -> bool:
        """The share watch's condition on the claim's entry of `device` (nodeagent.dra.watch);
        True when the claim holds it now."""
        now = now_rfc3339()

        def devices(current: Mapping[str, Any]) -> list[dict[str, Any]] | None:
            generation = (current.get("metadata") or {}).get("generation")
            condition = share_condition(ok, reason, message, generation, now, SHARE_CONDITION)
            return with_condition(current, self.driver, device, condition)

        return self._write(ref, devices, deadline, STATUS_SECONDS, None)

    def _write(
        self,
        ref: ClaimRef,
        devices: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
        deadline: float,
        share: float,
        claim: dict[str, Any] | None,
    ) -> bool:
        budget = min(share, deadline - self.clock())

        def read(current: dict[str, Any]) -> list[dict[str, Any]] | None:
            # The claim as read again (a conflict): one that cannot be read is not written.
            return devices(checked_claim(current, str(ref)))

        try:
            if budget < MIN_SECONDS:
                raise DeadlineExceeded(
                    f"no time left before the kubelet's deadline for {ref}'s status"
                )
            if claim is not None and read(claim) is None:
                return True  # the claim says so already (a kubelet's retry, a restart)
            written = self.api.update_claim_status(
                ref.namespace, ref.name, ref.uid, read, budget, claim
            )
        except AgentError as err:  # the API server down, the write refused, a bad claim
            self._outcome(ref, str(err))
            return False
        except Exception as err:  # a bug: it costs the report, never the kubelet's call
            log.debug("dra.status_write_crashed", claim=str(ref), exc_info=True)
            self._outcome(ref, f"internal error ({type(err).__name__}: {err})")
            return False
        self._outcome(ref, None)
        return written

    def _outcome(self, ref: ClaimRef, error: str | None) -> None:
        if self.stats is not None:
            self.stats.status_written(error is None)
        with self._lock:
            was, self._failing = self._failing, error is not None
        if error is not None and not was:
            log.warning("dra.status_write_failed", claim=str(ref), error=error)
        elif error is not None:
            log.debug("dra.status_write_failed", claim=str(ref), error=error)
        elif was:
            log.info("dra.status_write_restored", claim=str(ref))
