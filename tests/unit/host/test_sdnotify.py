"""The systemd notifier reads WATCHDOG_USEC as ASCII digits only: '²' passes str.isdigit() but
int() refuses it, which made `WATCHDOG_USEC=² nodeagent run` an internal error (exit 4)."""

from __future__ import annotations

import os

import pytest

from nodeagent.host.sdnotify import Notifier


@pytest.mark.parametrize("usec", ["\u00b2", "\u0662\u0660", "-1", " 5", "9" * 5000, ""])
def test_a_watchdog_interval_that_is_not_ascii_digits_is_no_watchdog(usec: str) -> None:
    assert Notifier({"WATCHDOG_USEC": usec}).watchdog_seconds is None


def test_a_watchdog_interval_for_this_process_is_read() -> None:
    mine = {"WATCHDOG_USEC": "400000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_seconds == 0.4
    assert Notifier({**mine, "WATCHDOG_PID": "1"}).watchdog_seconds is None
