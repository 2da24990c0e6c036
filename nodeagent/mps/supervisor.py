"""Health: probe the daemon; when it does not answer, restart it (a stale pipe directory is
reused) and re-apply its limits. One attempt per check: a failed restart raises, and the
agent's mps-probe worker backs off (doubling, capped) before the next check."""

from __future__ import annotations

from nodeagent.base.logs import get_logger
from nodeagent.mps.daemon import MpsDaemon

log = get_logger("nodeagent.mps")


class MpsSupervisor:
    def __init__(self) -> None:
        self.failed_probes = 0

    def check_once(self, daemon: MpsDaemon) -> None:
        """Probe; if the daemon does not answer, restart it once. Raises MpsError when the
        restart fails (the caller retries with backoff)."""
        if daemon.probe():
            return
        self.failed_probes += 1
        log.warning("mps.probe_failed", failed_probes=self.failed_probes)
        daemon.restart()
