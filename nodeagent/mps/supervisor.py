"""Health: probe the daemon every few seconds; on failure restart it with backoff (tenacity)
and re-apply its limits; count the restarts."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from nodeagent.errors import AgentError
from nodeagent.mps.daemon import MpsDaemon

log = structlog.get_logger("nodeagent.mps")


class MpsSupervisor(threading.Thread):
    def __init__(
        self,
        daemon: MpsDaemon,
        stop: threading.Event,
        max_backoff_seconds: float = 30.0,
        on_checked: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="mps-health", daemon=True)
        self.mps = daemon
        self.stop_event = stop
        self.max_backoff = max_backoff_seconds
        self.on_checked = on_checked
        self.failed_probes = 0

    def _log_retry(self, state: RetryCallState) -> None:
        log.warning(
            "mps.restart_failed",
            attempt=state.attempt_number,
            error=str(state.outcome.exception() if state.outcome else ""),
        )

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)

    def check_once(self) -> None:
        """Probe; if the daemon does not answer, restart it until it does (or we stop)."""
        if self.mps.probe():
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
        retrying(self.mps.restart)

    def run(self) -> None:
        interval = self.mps.settings.probe_interval_seconds
        while not self.stop_event.wait(interval):
            try:
                self.check_once()
            except AgentError as err:  # only when stopping mid-restart
                log.warning("mps.supervisor_stopped", error=str(err))
            if self.on_checked is not None:
                self.on_checked()
