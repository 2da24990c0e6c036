"""MPS as a reconciled resource: the pipeline says what it wants, the manager converges.

`plan(intent)` compares the wanted daemon (GPUs and limits) with the one running and returns
one change: start (or adopt a daemon already in the pipe directory), new limits, restart on
other GPUs, stop, or nothing. `apply()` does it and reads every limit back. A daemon the agent
adopted or started is left running when the agent exits (its clients keep working across a
rollout) unless `stop_on_exit` is asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.base.errors import MpsError
from nodeagent.base.logs import get_logger
from nodeagent.mps.daemon import ComputeModes, MpsDaemon, MpsStatus
from nodeagent.mps.layout import (
    DEVICE_PLUGIN,
    mount_shm,
    paths,
    prepare,
    same_filesystem,
    shm_size_kib,
)
from nodeagent.mps.regimes import MpsRegimes
from nodeagent.mps.settings import Limits, MpsSettings

log = get_logger("nodeagent.mps")


@dataclass(frozen=True)
class MpsIntent:
    """The daemon the node should run: resolved GPUs and validated limits."""

    settings: MpsSettings
    limits: Limits


@dataclass(frozen=True)
class MpsChange:
    action: str  # none | adopt | start | limits | restart | stop
    intent: MpsIntent | None = None
    reason: str = ""


NO_MPS_CHANGE = MpsChange("none")  # the daemon stays as it is (frozen, shared)


def prepare_layout(settings: MpsSettings) -> bool:
    """The device plugin's folders for this daemon (nodeagent.mps.layout.prepare: modes, the
    SELinux context); False in the flat layout. Raises MpsError or ConfigError."""
    if settings.shm_dir is None or settings.started_file is None:
        return False
    root = settings.shm_dir.parent
    where = paths(DEVICE_PLUGIN, root, str(settings.started_file.parent.relative_to(root)))
    log.info("mps.selinux", result=prepare(where))
    return True


class MpsManager:
    """The agent's MPS daemon. Every change and every probe holds `lock`: the health probe
    never restarts a daemon the pipeline is stopping or replacing."""

    def __init__(
        self,
        compute: ComputeModes | None = None,
        regimes: MpsRegimes | None = None,
        pipe: Callable[[], Path | None] | None = None,
    ) -> None:
        self.compute = compute
        # The GPUs of this daemon and of the DRA share servers: never both on one GPU (`pipe`:
        # where this daemon runs under the settings, for a share server of this process to
        # find one that another process started).
        self.regimes = regimes or MpsRegimes(pipe)
        self.daemon: MpsDaemon | None = None
        self.started_by_us = False
        self.status: MpsStatus | None = None
        self.lock = threading.RLock()
        self.shm = ""  # what became of <root>/shm (device-plugin layout)

    @property
    def serving(self) -> tuple[int, ...]:
        """GPU indices the managed daemon serves (none when MPS is not managed)."""
        return self.daemon.settings.devices if self.daemon is not None else ()

    def _clients(self) -> int:
        status = self.status
        return sum(len(c) for c in status.clients.values()) if status else 0

    def plan(self, intent: MpsIntent | None) -> MpsChange:
        """The one change from the daemon as it is to `intent`. Raises MpsError when the
        change would end running clients (a stop or a move to other GPUs waits for them)."""
        with self.lock:
            if intent is None:
                if self.daemon is None:
                    return NO_MPS_CHANGE
                if self._clients():
                    raise MpsError(
                        f"MPS is disabled but the daemon serves {self._clients()} clients;"
                        " it stops once they leave"
                    )
                return MpsChange("stop", reason="MPS disabled")
            if self.daemon is None:
                found = self._running(intent)
                if found == "limits":  # adopted, its limits changed (the start path does it)
                    return MpsChange("limits", intent, "a running daemon, adopted")
                return MpsChange(found or "start", intent)
            current = self.daemon
            old, new = current.settings, intent.settings
            moved = (old.pipe_dir, old.log_dir, old.layout, old.exclusive_process) != (
                new.pipe_dir,
                new.log_dir,
                new.layout,
                new.exclusive_process,
            )
            if moved:  # another resource name or layout: the daemon lives somewhere else
                if self._clients():
                    raise MpsError(
                        f"moving the MPS daemon from {old.pipe_dir} to {new.pipe_dir} needs a"
                        f" restart, which would end its {self._clients()} clients; it waits"
                        " until they leave"
                    )
                return MpsChange("restart", intent, "another place")
            if current.limits.visible_devices != intent.limits.visible_devices:
                if self._clients():
                    raise MpsError(
                        f"moving MPS from GPUs {list(current.settings.devices)} to"
                        f" {list(intent.settings.devices)} needs a daemon restart, which would"
                        f" end its {self._clients()} clients; it waits until they leave"
                    )
                return MpsChange("restart", intent, "other GPUs")
            if current.limits != intent.limits or current.settings != intent.settings:
                return MpsChange("limits", intent)
            return MpsChange("none", intent)

    def apply(self, change: MpsChange, claimed: Mapping[int, str] | None = None) -> None:
        """Do `change`; raises MpsError (a daemon this call started is stopped again; a GPU
        of a DRA share server, or of one of `claimed`'s MPS daemons (MpsRegimes.pipeline):
        nothing is done)."""
        if change.action == "none":
            return
        with self.lock:
            # 'limits' with no daemon held: one found running (plan), taken over by the start
            # path, which sets its limits: a daemon this process starts to hold, as a start.
            takes = change.action in ("adopt", "start", "restart") or (
                change.action == "limits" and self.daemon is None
            )
            if change.intent is not None and takes:
                self.regimes.pipeline(change.intent.settings.devices, claimed)
            if change.action == "adopt" and change.intent is not None:
                self.daemon = MpsDaemon(change.intent.settings, change.intent.limits, self.compute)
                self.started_by_us = False
                log.info("mps.adopted", pid=self.daemon.control.daemon_pid())
                self.refresh_status()
                return
            if change.action in ("stop", "restart") and self.daemon is not None:
                self.daemon.stop()
                log.info("mps.stopped_for_change", reason=change.reason or change.action)
                self.daemon, self.status, self.started_by_us = None, None, False
            if change.action == "stop":
                self.regimes.pipeline(())
                return
            assert change.intent is not None
            if change.action == "limits" and self.daemon is not None:
                daemon = self.daemon
                daemon.clear_ready()  # not ready while the limits change
                before = daemon.settings, daemon.limits
                daemon.settings, daemon.limits = change.intent.settings, change.intent.limits
                try:
                    daemon.apply_limits()
                    daemon.verify()
                except MpsError:
                    # Not taken: the next run plans the change again (and stays not ready).
                    daemon.settings, daemon.limits = before
                    raise
                status = daemon.status()
                daemon.write_ready(status)
                self.status = status
                log.info("mps.limits", percentage=change.intent.limits.thread_percentage)
            else:
                daemon = MpsDaemon(change.intent.settings, change.intent.limits, self.compute)
                try:
                    self._prepare(change.intent.settings)
                    adopted = self._adoptable(daemon)
                    self.status = daemon.start()  # read just now
                except BaseException:
                    self.regimes.pipeline(())  # none runs: the GPUs are free for share servers
                    raise
                self.daemon, self.started_by_us = daemon, not adopted

    def _running(self, intent: MpsIntent) -> str | None:
        """What already runs in the pipe directory (an agent restart, a second command):
        'adopt', a daemon for these GPUs with these limits (read back): nothing to change;
        'limits', one for these GPUs whose limits differ: adopted, and its limits set; None,
        none, or one for other GPUs (started, replacing it while it has no clients)."""
        daemon = MpsDaemon(intent.settings, intent.limits, self.compute)
        pid = daemon.control.daemon_pid()
        if pid is None:
            return None
        running = daemon.control.daemon_devices(pid)
        if running is not None and ",".join(running) != intent.limits.visible_devices:
            return None
        try:
            daemon.verify()
        except MpsError:
            return "limits"
        return "adopt"

    def _prepare(self, settings: MpsSettings) -> None:
        """The device plugin's layout: folders clients can traverse, and `<root>/shm` as a
        tmpfs. A tmpfs that cannot be mounted here (no CAP_SYS_ADMIN) is reported, not fatal:
        the folder still works as shared memory where /run is a tmpfs, without a size cap."""
        if settings.shm_dir is None or not prepare_layout(settings):
            return
        try:
            self.shm = mount_shm(settings.shm_dir, shm_size_kib(settings.shm_size))
            log.info("mps.shm", result=self.shm)
        except MpsError as err:
            self.shm = f"not mounted: {err}"
            log.warning("mps.shm.not_mounted", error=str(err))
            return
        if not same_filesystem(Path("/dev/shm"), settings.shm_dir):
            # The daemon uses this process's /dev/shm; clients get <root>/shm as theirs.
            self.shm += (
                f"; but the daemon's /dev/shm is not {settings.shm_dir}: run the agent with it"
                " mounted as /dev/shm (the DaemonSet's MPS component does)"
            )
            log.warning("mps.shm.not_the_daemons", shm=str(settings.shm_dir))

    def _adoptable(self, daemon: MpsDaemon) -> bool:
        """Whether a daemon already runs in the pipe directory for exactly these GPUs (then it
        is adopted). One on other GPUs is replaced when idle, refused when it has clients."""
        pid = daemon.control.daemon_pid()
        if pid is None:
            return False
        running = daemon.control.daemon_devices(pid)
        wanted = daemon.limits.visible_devices
        if running is None or ",".join(running) == wanted:
            return True
        found = daemon.status()
        clients = sum(len(c) for c in found.clients.values())
        if clients:
            raise MpsError(
                f"an MPS daemon (pid {pid}) already runs in {daemon.settings.pipe_dir} for"
                f" other GPUs ({','.join(running)}) with {clients} clients; it is not replaced"
                " while they run"
            )
        log.warning("mps.replacing", pid=pid, had=",".join(running), wanted=wanted)
        daemon.stop()
        return False

    def verify(self) -> None:
        """Read the limits back (the daemon ignores bad values silently)."""
        with self.lock:
            if self.daemon is not None:
                self.daemon.verify()

    def refresh_status(self) -> MpsStatus | None:
        with self.lock:
            self.status = self.daemon.status() if self.daemon is not None else None
            return self.status

    def probe(self, check: Callable[[MpsDaemon], None]) -> None:
        """Run the health check on the managed daemon, if any, under the lock."""
        with self.lock:
            if self.daemon is not None:
                check(self.daemon)
                self.refresh_status()

    def shutdown(self, stop_daemon: bool) -> None:
        """At exit: quit the daemon only when asked; else leave it to its clients."""
        with self.lock:
            if self.daemon is None:
                return
            if stop_daemon:
                self.daemon.stop()
                self.regimes.pipeline(())
            else:
                log.info("mps.left_running", pid=self.daemon.control.daemon_pid())
            self.daemon = None
