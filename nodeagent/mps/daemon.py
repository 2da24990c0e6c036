"""The MPS control daemon's lifecycle: start, limits set and read back, ready file, stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nodeagent.base.errors import AgentError, MpsError
from nodeagent.base.files import atomic_write_text, remove_regular
from nodeagent.base.logs import get_logger
from nodeagent.base.units import decimal
from nodeagent.mps.control import MpsControl, limit_holds, parent_pid, process_alive
from nodeagent.mps.settings import Limits, MpsSettings, mps_size, parse_size

log = get_logger("nodeagent.mps")


class ComputeModes(Protocol):
    def set_exclusive_process(self, index: int, exclusive: bool) -> None: ...


@dataclass
class MpsStatus:
    running: bool
    pid: int | None = None
    thread_percentage: float | None = None
    pinned_bytes: dict[int, int | None] = field(default_factory=dict)
    servers: list[int] = field(default_factory=list)
    clients: dict[int, list[int]] = field(default_factory=dict)
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "pid": self.pid,
            "thread_percentage": self.thread_percentage,
            "pinned_memory_limit_bytes": {str(k): v for k, v in self.pinned_bytes.items()},
            "servers": self.servers,
            "clients": {str(k): v for k, v in self.clients.items()},
            "restarts": self.restarts,
        }


def _kill(pid: int) -> None:
    """SIGKILL a process of the daemon (one that ended meanwhile is fine). Raises MpsError
    when it is not ours to kill."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as err:
        raise MpsError(f"cannot end MPS process {pid}: {err.strerror}") from err


class MpsDaemon:
    """One MPS control daemon for the GPUs in `settings.devices`."""

    def __init__(
        self, settings: MpsSettings, limits: Limits, compute: ComputeModes | None = None
    ) -> None:
        self.settings = settings
        self.limits = limits
        self.compute = compute
        self.control = MpsControl(
            settings.control_binary,
            settings.pipe_dir,
            settings.log_dir,
            settings.command_timeout_seconds,
        )
        self.restarts = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> MpsStatus:
        """Start (or adopt a running) daemon, apply the limits, read them back, write the ready
        file. Raises MpsError; a daemon it started is stopped again on failure."""
        started = False
        self.clear_ready()  # an adopted daemon is not ready while its limits are set again
        try:
            self._set_exclusive(True)
            if self.control.daemon_pid() is None:
                self.control.start_daemon(self.limits.visible_devices)
                started = True
                log.info(
                    "mps.started",
                    pid=self.control.daemon_pid(),
                    devices=self.limits.visible_devices,
                )
            else:
                log.info("mps.adopted", pid=self.control.daemon_pid())
            self.apply_limits()
            self.verify()
            status = self.status()
            self.write_ready(status)
        except AgentError:
            # Undo what this call did, and only that: an adopted daemon keeps running.
            if started:
                self.stop()
            elif self.control.daemon_pid() is None:
                self._set_exclusive(False)
            raise
        return status

    def write_ready(self, status: MpsStatus | None = None) -> None:
        """The ready markers, written only once the limits were read back: the flat layout's
        JSON ready file; the device plugin's empty `<resource>/.started`, then `<root>/.ready`.
        Raises MpsError when one cannot be written."""
        s = self.settings
        markers: list[tuple[Path, str]] = []
        if s.started_file is not None:
            markers = [(s.started_file, ""), (s.ready_file, "")]
        else:
            status = status or self.status()
            markers = [(s.ready_file, json.dumps(status.to_dict()) + "\n")]
        for path, text in markers:
            try:
                atomic_write_text(path, text, mode=0o644, what="the MPS ready file")
            except OSError as err:
                raise MpsError(f"cannot write the MPS ready file {path}: {err.strerror}") from err

    def clear_ready(self) -> None:
        """Remove the ready markers first, before a stop, a restart or a limit change: a
        device plugin never advertises shared devices on a daemon whose limits are changing
        (the readiness race of k8s-device-plugin PR #1946). Raises ConfigError when a marker
        path is not a regular file (a device node or a link is never removed)."""
        for path in (self.settings.ready_file, self.settings.started_file):
            if path is not None:
                with contextlib.suppress(OSError):  # one that cannot be there is not there
                    remove_regular(path, "the MPS ready file")

    def apply_limits(self) -> None:
        self.control.command(
            f"set_default_active_thread_percentage {self.limits.thread_percentage}"
        )
        for device, size in sorted(self.limits.pinned_bytes.items()):
            self.control.command(f"set_default_device_pinned_mem_limit {device} {mps_size(size)}")

    def read_back(self) -> tuple[float | None, dict[int, int | None]]:
        """The daemon's default thread percentage and pinned limit per MPS device index."""
        pct = decimal(self.control.command("get_default_active_thread_percentage"))
        pinned: dict[int, int | None] = {}
        for device in sorted(self.limits.pinned_bytes) or range(self._device_count()):
            text = self.control.command(f"get_default_device_pinned_mem_limit {device}")
            try:
                pinned[device] = parse_size(text) if text else None
            except AgentError:
                pinned[device] = None
        return pct, pinned

    def _device_count(self) -> int:
        """How many devices the running daemon has (its CUDA_VISIBLE_DEVICES), else ours."""
        pid = self.control.daemon_pid()
        devices = self.control.daemon_devices(pid) if pid is not None else None
        return len(devices) if devices is not None else len(self.settings.devices)

    def verify(self) -> None:
        """The daemon ignores bad values silently: only a read-back proves a setting holds."""
        pct, pinned = self.read_back()
        problems = []
        if pct != float(self.limits.thread_percentage):
            problems.append(
                f"default active thread percentage is {pct}, wanted {self.limits.thread_percentage}"
            )
        for device, want in sorted(self.limits.pinned_bytes.items()):
            if not limit_holds(pinned.get(device), want):
                got = pinned.get(device)
                problems.append(
                    f"pinned memory limit of MPS device {device} is"
                    f" {'unset' if got is None else mps_size(got)}, wanted {mps_size(want)}"
                )
        if problems:
            raise MpsError("MPS limits did not hold: " + "; ".join(problems))

    def probe(self) -> bool:
        """A bounded round trip to the daemon."""
        try:
            self.control.percentage("get_default_active_thread_percentage")
            return True
        except AgentError:
            return False

    def restart(self) -> None:
        """After a failed probe: start a new daemon (a stale pipe directory is reused) and
        re-apply the limits."""
        pid = self.control.daemon_pid()
        self.clear_ready()
        if pid is not None:  # alive but not answering: it cannot be trusted
            _kill(pid)
            self._wait_gone(pid, 5)
        self.control.start_daemon(self.limits.visible_devices)
        self.apply_limits()
        self.verify()
        self.write_ready()
        self.restarts += 1
        log.warning("mps.restarted", pid=self.control.daemon_pid(), restarts=self.restarts)

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """`quit`, wait for the daemon to exit, kill what is left (daemon and servers)."""
        self.clear_ready()
        pid = self.control.daemon_pid()
        if pid is None:
            self._set_exclusive(False)
            return
        servers: list[int] = []
        try:
            # Only the daemon's own children are ever killed: the list is the daemon's word.
            listed = self.control.server_pids()
            servers = [s for s in listed if parent_pid(s) == pid]
        except AgentError as err:  # an answer it cannot read: still told to quit
            log.warning("mps.servers_unknown", error=str(err))
        try:
            self.control.command("quit")
        except AgentError as err:
            log.warning("mps.quit_failed", error=str(err))
        if not self._wait_gone(pid, timeout_seconds):
            log.warning("mps.kill", pid=pid)
            _kill(pid)
            self._wait_gone(pid, 5)
        for server in servers:
            if not self._wait_gone(server, 2):
                _kill(server)
        self._set_exclusive(False)
        log.info("mps.stopped", pid=pid)

    def _set_exclusive(self, exclusive: bool) -> None:
        if self.settings.exclusive_process and self.compute is not None:
            for index in self.settings.devices:
                self.compute.set_exclusive_process(index, exclusive)

    @staticmethod
    def _wait_gone(pid: int, timeout_seconds: float) -> bool:
        """Wait for `pid` to exit; a zombie (exited, not yet reaped by init) counts as gone."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child: reap it
                    return True
            except ChildProcessError:
                pass
            if not process_alive(pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def status(self) -> MpsStatus:
        pid = self.control.daemon_pid()
        if pid is None:
            return MpsStatus(False, restarts=self.restarts)
        try:
            pct, pinned = self.read_back()
            servers = self.control.server_pids()
            clients = {s: self.control.client_pids(s) for s in servers}
        except AgentError:
            return MpsStatus(False, pid, restarts=self.restarts)
        return MpsStatus(True, pid, pct, pinned, servers, clients, self.restarts)
