"""Health: probe the daemon; on failure restart it with backoff (tenacity) and re-apply its
limits; count the restarts. The agent's mps-probe worker calls `check_once()` every
`probe-interval` seconds."""

from __future__ import annotations

import threading

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from nodeagent.errors import AgentError
from nodeagent.logs import get_logger
from nodeagent.mps.daemon import MpsDaemon

log = get_logger("nodeagent.mps")


class MpsSupervisor:
    def __init__(self, stop: threading.Event, max_backoff_seconds: float = 30.0) -> None:
        self.stop_event = stop
        self.max_backoff = max_backoff_seconds
        self.failed_probes = 0

    def _log_retry(self, state: RetryCallState) -> None:
        log.warning(
            "mps.restart_failed",
            attempt=state.attempt_number,
            error=str(state.outcome.exception() if state.outcome else ""),
        )

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)

    def check_once(self, daemon: MpsDaemon) -> None:
        """Probe; if the daemon does not answer, restart it until it does (or we stop).
        Raises AgentError only when stopping mid-restart."""
        if daemon.probe():
            return
        self.failed_probes += 1
        log.warning("mps.probe_failed", failed_probes=self.failed_probes)
        retrying = Retrying(
            retry=retry_if_exception_type(AgentError),
            wait=wait_exponential(multiplier=0.5, max=self.max_backoff),
            stop=lambda _state: self.stop_event.is_set(),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        retrying(daemon.restart)
