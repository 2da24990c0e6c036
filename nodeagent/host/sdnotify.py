"""systemd's notify protocol (sd_notify(3)) without libsystemd: READY=1 once serving,
WATCHDOG=1 while healthy, RELOADING=1/READY=1 around a reload, STOPPING=1 at the end.

Only under a unit with `Type=notify` (NOTIFY_SOCKET set); a no-op everywhere else.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from nodeagent.base.units import whole_number


class Notifier:
    def __init__(self, environ: Mapping[str, str]) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # an abstract socket
            address = "\0" + address[1:]
        self.address = address or None
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        micros = whole_number(usec)  # ASCII digits: '²' passes isdigit() but not int()
        self.watchdog_seconds = micros / 1e6 if micros is not None and mine else None
        self._sock: socket.socket | None = None

    def send(self, *fields: str) -> bool:
        """One datagram. The socket is opened once and kept: a message that matters (READY=1
        after a reload, STOPPING=1) must not depend on a free file descriptor at that moment
        (`ulimit -n` reached); it is opened again where the send fails (systemd re-executed)."""
        if self.address is None:
            return False
        data = "\n".join(fields).encode()
        for _ in range(2):
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._sock.connect(self.address)
                self._sock.sendall(data)
                return True
            except OSError:
                self.close()
        return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
