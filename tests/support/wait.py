"""Waiting in a test for something that happens on its own time (an agent, an API server, a
scheduler): one polling loop for every helper that waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 60,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll `predicate` until it is truthy and return its value; an exception of `ignore`
    counts as not yet. Raises AssertionError naming `what` and the last value at `timeout`."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except ignore:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
