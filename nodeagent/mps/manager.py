"""MPS as a reconciled resource: the pipeline says what it wants, the manager converges.

`plan(intent)` compares the wanted daemon (GPUs and limits) with the one running and returns
one change: start (or adopt a daemon already in the pipe directory), new limits, restart on
other GPUs, stop, or nothing. `apply()` does it and reads every limit back. A daemon the agent
adopted or started is left running when the agent exits (its clients keep working across a
rollout) unless `stop_on_exit` is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.errors import MpsError
from nodeagent.logs import get_logger
from nodeagent.mps.daemon import ComputeModes, MpsDaemon, MpsStatus
from nodeagent.mps.settings import Limits, MpsSettings

log = get_logger("nodeagent.mps")


@dataclass(frozen=True)
class MpsIntent:
    """The daemon the node should run: resolved GPUs and validated limits."""

    settings: MpsSettings
    limits: Limits


@dataclass(frozen=True)
class MpsChange:
    action: str  # none | start | limits | restart | stop
    intent: MpsIntent | None = None
    reason: str = ""


class MpsManager:
    def __init__(self, compute: ComputeModes | None = None) -> None:
        self.compute = compute
        self.daemon: MpsDaemon | None = None
        self.started_by_us = False
        self.status: MpsStatus | None = None

    @property
    def serving(self) -> tuple[int, ...]:
        """GPU indices the managed daemon serves (none when MPS is not managed)."""
        return self.daemon.settings.devices if self.daemon is not None else ()

    def plan(self, intent: MpsIntent | None) -> MpsChange:
        """Pure apart from asking the daemon for its clients when a restart would end them."""
        if intent is None:
            return MpsChange("stop", reason="MPS disabled") if self.daemon else MpsChange("none")
        if self.daemon is None:
            return MpsChange("start", intent)
        current = self.daemon
        if current.limits.visible_devices != intent.limits.visible_devices:
            clients = self.status.clients if self.status else {}
            if any(clients.values()):
                raise MpsError(
                    f"moving MPS from GPUs {list(current.settings.devices)} to"
                    f" {list(intent.settings.devices)} needs a daemon restart, which would end"
                    f" its {sum(len(c) for c in clients.values())} clients; it waits until they"
                    " leave"
                )
            return MpsChange("restart", intent, "other GPUs")
        if current.limits != intent.limits or current.settings != intent.settings:
            return MpsChange("limits", intent)
        return MpsChange("none", intent)

    def apply(self, change: MpsChange) -> None:
        """Do `change`; raises MpsError (a daemon this call started is stopped again)."""
        if change.action == "none":
            return
        if change.action in ("stop", "restart") and self.daemon is not None:
            self.daemon.stop()
            log.info("mps.stopped_for_change", reason=change.reason or change.action)
            self.daemon, self.status, self.started_by_us = None, None, False
        if change.action == "stop":
            return
        assert change.intent is not None
        if change.action == "limits" and self.daemon is not None:
            self.daemon.settings = change.intent.settings
            self.daemon.limits = change.intent.limits
            self.daemon.apply_limits()
            self.daemon.verify()
            self.daemon.write_ready()
            log.info("mps.limits", percentage=change.intent.limits.thread_percentage)
        else:
            daemon = MpsDaemon(change.intent.settings, change.intent.limits, self.compute)
            adopted = daemon.control.daemon_pid() is not None
            self.status = daemon.start()
            self.daemon, self.started_by_us = daemon, not adopted
        self.refresh_status()

    def verify(self) -> None:
        """Read the limits back (the daemon ignores bad values silently)."""
        if self.daemon is not None:
            self.daemon.verify()

    def refresh_status(self) -> MpsStatus | None:
        self.status = self.daemon.status() if self.daemon is not None else None
        return self.status

    def shutdown(self, stop_daemon: bool) -> None:
        """At exit: quit the daemon only when asked; else leave it to its clients."""
        if self.daemon is None:
            return
        if stop_daemon:
            self.daemon.stop()
        else:
            log.info("mps.left_running", pid=self.daemon.control.daemon_pid())
        self.daemon = None
