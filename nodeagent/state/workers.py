"""Supervised workers: every loop survives every exception, backs off, and keeps a heartbeat.

A worker that raises is logged with its name, counted (`nodeagent_worker_errors_total`), and
run again after a backoff that doubles per consecutive failure (capped). `/healthz` asks each
worker `health()`: a thread that died, or one whose heartbeat is older than its allowance (a
waiting worker's counts from the end of its wait), is unhealthy. Intervals are callables so
that a settings reload changes them without a restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nodeagent.base.logs import get_logger

log = get_logger("nodeagent.state.workers")
Clock = Callable[[], float]


@dataclass(frozen=True)
class Health:
    ok: bool
    reason: str


class Worker(threading.Thread):
    """Runs `work()` every `interval()` seconds (or at once when woken) until `stop` is set.

    `busy_allowance_seconds` is how long one `work()` may take before the worker counts as
    stale (a reconcile waiting for paused clients may legitimately take minutes).
    `on_errors(name, count)` is told the failures since start: 0 when made, then after each.
    """

    def __init__(
        self,
        name: str,
        work: Callable[[], None],
        interval: Callable[[], float],
        stop: threading.Event,
        busy_allowance_seconds: float | Callable[[], float] = 60.0,
        max_backoff_seconds: float = 60.0,
        wait_first: bool = False,
        clock: Clock = time.monotonic,
        on_errors: Callable[[str, int], None] = lambda _name, _count: None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.on_errors = on_errors
        self.work = work
        self.interval = interval
        self.stop_event = stop
        self.busy_allowance_seconds = busy_allowance_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.wait_first = wait_first
        self.clock = clock
        self.wake_event = threading.Event()
        self.errors = 0  # every failure since start
        self.failures = 0  # consecutive failures
        on_errors(name, 0)
        self.heartbeat = clock()
        self.busy = False
        self.wait_deadline: float | None = None  # while waiting: when the wait ends

    def wake(self) -> None:
        """Run the work now instead of at the end of the current wait."""
        self.wake_event.set()

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds` by the worker's clock, or until woken or stopped (a stop wakes it).

        On time.monotonic the thread sleeps the whole wait at once: an idle agent's four
        workers woke every second only to say so (~0.08 ms of CPU a wake on the 2-core VM).
        Another clock (a test's virtual one) may jump: it is read again every second.
        """
        deadline = self.clock() + seconds
        self.wait_deadline = deadline
        slice_seconds = None if self.clock is time.monotonic else 1.0
        while not self.stop_event.is_set():
            self.heartbeat = self.clock()
            left = deadline - self.heartbeat
            if left <= 0 or self.wake_event.is_set():
                break
            self.wake_event.wait(left if slice_seconds is None else min(left, slice_seconds))
        self.wait_deadline = None
        self.wake_event.clear()

    def delay(self) -> float:
        try:
            base = float(max(self.interval(), 0.0))
        except Exception:  # an interval that cannot be read must not end the worker
            base = 1.0
        if not self.failures:
            return base
        # The exponent is capped before the power: a streak of failures never overflows.
        doubling = 2.0 ** min(self.failures - 1, 32)
        return min(max(base, 1.0) * doubling, self.max_backoff_seconds)

    def run(self) -> None:
        if self.wait_first:
            self._wait(self.interval())
        while not self.stop_event.is_set():
            self.busy, self.heartbeat = True, self.clock()
            try:
                self.work()
                self.failures = 0
            except Exception as err:  # a worker never dies: log, count, back off, go on
                self.errors += 1
                self.failures += 1
                self.on_errors(self.name, self.errors)
                log.error(
                    "worker.failed",
                    worker=self.name,
                    error=str(err) or type(err).__name__,
                    error_type=type(err).__name__,
                    failures=self.failures,
                    exc_info=not _expected(err),
                )
            finally:
                self.busy, self.heartbeat = False, self.clock()
            self._wait(self.delay())

    def health(self) -> Health:
        if not self.is_alive():
            if self.stop_event.is_set():
                return Health(True, "stopped")
            return Health(False, f"worker {self.name} is not running")
        now = self.clock()
        waiting_until = self.wait_deadline
        if waiting_until is not None and not self.busy:
            # Blocked in its wait (a live thread): healthy until well past the wait's end.
            age = max(now - max(waiting_until, self.heartbeat), 0.0)
        else:
            age = now - self.heartbeat
        busy = self.busy_allowance_seconds
        allowance = (busy() if callable(busy) else busy) if self.busy else 30.0
        if age > allowance:
            state = "busy in one run" if self.busy else "silent"
            return Health(False, f"worker {self.name} {state} for {age:.0f} s")
        return Health(True, "ok")


def _expected(err: Exception) -> bool:
    """nodeagent's own errors are one sentence; anything else is a bug: log its traceback."""
    from nodeagent.base.errors import AgentError

    return isinstance(err, AgentError)
