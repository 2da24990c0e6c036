"""Supervised workers as the agent and /healthz see them: a worker survives whatever its work
raises, backs off, runs at once when woken, stops promptly, and says when it is unhealthy.

Time is a fake clock the test advances; the tests wait on events (with a timeout), never on
fixed sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from nodeagent.base.errors import AgentError, MigError
from nodeagent.state.workers import Health, Worker

TIMEOUT = 5.0  # seconds a test waits for the worker thread before it fails
LONG = 3600.0  # an interval no test waits out


class FakeClock:
    """A monotonic clock that moves only when the test says so, and wakes a test waiting
    for a worker's next read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._tester = threading.get_ident()
        self._changed = threading.Condition()

    def __call__(self) -> float:
        with self._changed:
            if threading.get_ident() != self._tester:
                self._changed.notify_all()
            return self.now

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds

    def wait_until(self, predicate: Callable[[], bool]) -> bool:
        """Wait until `predicate()` holds, testing it again each time a worker reads the clock
        (a worker reads it at every heartbeat); False after TIMEOUT."""
        with self._changed:
            return self._changed.wait_for(predicate, TIMEOUT)


StartWorker = Callable[..., Worker]


@pytest.fixture
def start_worker() -> Iterator[StartWorker]:
    """Starts workers named 'sampler' (interval LONG unless given) and stops them afterwards."""
    started: list[Worker] = []

    def start(
        work: Callable[[], None], interval: Callable[[], float] = lambda: LONG, **kw: object
    ) -> Worker:
        worker = Worker("sampler", work, interval, threading.Event(), **kw)  # type: ignore[arg-type]
        started.append(worker)
        worker.start()
        return worker

    yield start
    for worker in started:
        worker.stop_event.set()
        worker.wake()
    for worker in started:
        worker.join(TIMEOUT)
        assert not worker.is_alive(), f"worker {worker.name} did not stop"


def _undecodable() -> None:
    b"\xff".decode("utf-8")


def _divide_by_zero() -> None:
    _ = 1 / 0


def _runtime_error() -> None:
    raise RuntimeError("the sampler lost its GPU")


def _agent_error() -> None:
    raise MigError("slice in use")


def _key_error() -> None:
    raise KeyError("gpu-0")


def _empty_message() -> None:
    raise RuntimeError()


class Script:
    """Work whose first `times` runs call `action` (which raises or blocks) and whose later
    runs return at once; each run sets the event of its number, so a test can wait for the
    n-th run."""

    def __init__(self, action: Callable[[], object] | None = None, times: int = 0) -> None:
        self.action, self.times = action, times
        self.calls = 0
        self.ran = [threading.Event() for _ in range(times + 5)]

    def __call__(self) -> None:
        self.calls += 1
        if self.calls < len(self.ran):
            self.ran[self.calls].set()
        if self.calls <= self.times and self.action is not None:
            self.action()


# -- every exception is survived -------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [_runtime_error, _undecodable, _divide_by_zero, _key_error, _empty_message, _agent_error],
    ids=["RuntimeError", "UnicodeDecodeError", "ZeroDivisionError", "KeyError", "no-message", "AgentError"],
)  # fmt: skip
def test_worker_survives_what_its_work_raises(
    start_worker: StartWorker, failure: Callable[[], None]
) -> None:
    work = Script(failure, times=3)
    # A backoff cap of 0 s lets the failures follow each other without waiting.
    worker = start_worker(work, max_backoff_seconds=0.0)
    assert work.ran[4].wait(TIMEOUT), "the worker did not run again after its failures"
    worker.wake()  # one more run: by then the successful fourth one has been counted
    assert work.ran[5].wait(TIMEOUT)
    assert worker.is_alive()
    assert (worker.errors, worker.failures) == (3, 0)
    assert worker.health() == Health(True, "ok")


def test_errors_count_every_failure_and_failures_only_the_last_streak(
    start_worker: StartWorker,
) -> None:
    outcomes = iter([True, True, False, True, False, False])  # True: this run fails
    ran = [threading.Event() for _ in range(8)]
    calls = 0

    def work() -> None:
        nonlocal calls
        calls += 1
        ran[calls].set()
        if next(outcomes, False):
            raise AgentError("NVML is not answering")

    worker = start_worker(work, max_backoff_seconds=0.0)
    assert ran[3].wait(TIMEOUT)  # two failures, then a success (which waits LONG)
    worker.wake()
    assert ran[4].wait(TIMEOUT)  # a failure: no wait before the next run
    assert ran[5].wait(TIMEOUT)  # a success
    worker.wake()
    assert ran[6].wait(TIMEOUT)
    assert (worker.errors, worker.failures) == (3, 0)


def test_the_error_count_is_published_when_made_and_after_each_failure(
    start_worker: StartWorker,
) -> None:
    published: list[tuple[str, int]] = []
    script = Script(_runtime_error, times=2)
    start_worker(script, max_backoff_seconds=0.0, on_errors=lambda *told: published.append(told))
    assert script.ran[3].wait(TIMEOUT)  # two failures, then a success
    assert published == [("sampler", 0), ("sampler", 1), ("sampler", 2)]


def test_worker_survives_a_long_streak_of_failures(start_worker: StartWorker) -> None:
    streak = 1100
    reached = threading.Event()
    calls = 0

    def work() -> None:
        nonlocal calls
        calls += 1
        if calls > streak:
            reached.set()
            return
        raise AgentError("the API server is down")

    worker = start_worker(work, max_backoff_seconds=0.0)
    while not reached.wait(0.05) and worker.is_alive():
        pass
    assert reached.is_set() and worker.is_alive()
    assert worker.errors == streak


# -- backoff ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "failures", "expected"),
    [
        (5.0, 0, 5.0),
        (5.0, 1, 5.0),
        (5.0, 2, 10.0),
        (5.0, 3, 20.0),
        (5.0, 4, 40.0),
        (5.0, 5, 60.0),
        (5.0, 50, 60.0),
        (0.0, 0, 0.0),
        (0.0, 1, 1.0),
        (0.0, 2, 2.0),
        (0.0, 3, 4.0),
        (0.0, 6, 32.0),
        (0.0, 7, 60.0),
        (0.25, 1, 1.0),
        (-1.0, 0, 0.0),
        (-1.0, 2, 2.0),
        (120.0, 0, 120.0),  # the cap is for backoff, not for the interval itself
        (120.0, 1, 60.0),
        (0.0, 1024, 60.0),
        (0.0, 1025, 60.0),
        (0.0, 5000, 60.0),
    ],
)  # fmt: skip
def test_delay_doubles_with_failures_up_to_the_cap(
    interval: float, failures: int, expected: float
) -> None:
    worker = Worker("sampler", lambda: None, lambda: interval, threading.Event())
    worker.failures = failures
    assert worker.delay() == expected


def test_backoff_cap_is_a_setting() -> None:
    worker = Worker("sampler", lambda: None, lambda: 1.0, threading.Event(), max_backoff_seconds=5)
    delays = []
    for failures in range(6):
        worker.failures = failures
        delays.append(worker.delay())
    assert delays == [1.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_interval_is_read_at_each_run() -> None:
    seconds = [10.0]
    worker = Worker("sampler", lambda: None, lambda: seconds[0], threading.Event())
    assert worker.delay() == 10.0
    seconds[0] = 2.0  # a settings reload
    assert worker.delay() == 2.0


# -- wake and stop ------------------------------------------------------------------------------


def test_wake_runs_the_work_before_the_interval_ends(start_worker: StartWorker) -> None:
    work = Script()
    worker = start_worker(work)
    assert work.ran[1].wait(TIMEOUT)
    worker.wake()
    assert work.ran[2].wait(TIMEOUT)
    worker.wake()
    assert work.ran[3].wait(TIMEOUT)


def test_wake_during_a_run_runs_the_work_once_more(start_worker: StartWorker) -> None:
    inside, release = threading.Event(), threading.Event()

    def first_run_blocks() -> None:
        inside.set()
        release.wait(TIMEOUT)

    work = Script(first_run_blocks, times=1)
    worker = start_worker(work)
    assert inside.wait(TIMEOUT)
    worker.wake()  # while the first run is still going
    release.set()
    assert work.ran[2].wait(TIMEOUT)


def test_wait_first_runs_only_when_woken(start_worker: StartWorker) -> None:
    work = Script()
    worker = start_worker(work, wait_first=True)
    assert not work.ran[1].is_set()
    worker.wake()
    assert work.ran[1].wait(TIMEOUT)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "in-a-run"])
def test_stop_ends_the_thread_promptly(start_worker: StartWorker, busy: bool) -> None:
    release = threading.Event()
    work = Script(lambda: release.wait(TIMEOUT), times=1 if busy else 0)
    worker = start_worker(work)
    assert work.ran[1].wait(TIMEOUT)
    worker.stop_event.set()
    worker.wake()
    release.set()
    worker.join(TIMEOUT)
    assert not worker.is_alive()
    assert work.calls == 1  # no run after the stop
    assert worker.health() == Health(True, "stopped")


# -- health -------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_worker_that_ended_without_stop_is_unhealthy(start_worker: StartWorker) -> None:
    def work() -> None:
        raise SystemExit(1)  # not an Exception: nothing in a worker catches it

    worker = start_worker(work)
    worker.join(TIMEOUT)
    assert not worker.is_alive()
    assert worker.health() == Health(False, "worker sampler is not running")


def test_worker_never_started_is_unhealthy() -> None:
    worker = Worker("sampler", lambda: None, lambda: LONG, threading.Event())
    assert worker.health() == Health(False, "worker sampler is not running")


@pytest.mark.parametrize(
    ("busy_seconds", "healthy"),
    [(0.0, True), (60.0, True), (120.0, True), (121.0, False), (3600.0, False)],
)
def test_worker_busy_longer_than_its_allowance_is_unhealthy(
    start_worker: StartWorker, busy_seconds: float, healthy: bool
) -> None:
    clock = FakeClock()
    inside, release = threading.Event(), threading.Event()

    def first_run_blocks() -> None:
        inside.set()
        release.wait(TIMEOUT)

    work = Script(first_run_blocks, times=1)
    worker = start_worker(work, busy_allowance_seconds=120.0, clock=clock)
    try:
        assert inside.wait(TIMEOUT)
        clock.advance(busy_seconds)
        health = worker.health()
    finally:
        release.set()
    if healthy:
        assert health == Health(True, "ok")
    else:
        assert health == Health(False, f"worker sampler busy in one run for {busy_seconds:.0f} s")
    worker.wake()  # the long run is over: the next one is healthy again
    assert work.ran[2].wait(TIMEOUT)
    assert worker.health() == Health(True, "ok")


def test_idle_worker_keeps_beating_through_a_long_interval(start_worker: StartWorker) -> None:
    clock = FakeClock()
    work = Script()
    worker = start_worker(work, interval=lambda: 600.0, clock=clock)
    assert work.ran[1].wait(TIMEOUT)
    # 100 s into a 600 s wait: far past the 30 s an idle worker may stay silent, so only a
    # heartbeat taken while waiting keeps it healthy.
    clock.advance(100.0)
    assert clock.wait_until(lambda: worker.health().ok), worker.health().reason
    assert work.calls == 1


def test_idle_worker_on_the_monotonic_clock_sleeps_its_whole_interval_at_once() -> None:
    """No wake-up every second to take a heartbeat: the thread sleeps until the interval ends
    (or it is woken), and stays healthy through a wait longer than the 30 s of silence."""
    waits: list[float | None] = []
    slept = threading.Event()

    class RecordingEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            slept.set()
            return super().wait(timeout)

    work = Script()
    worker = Worker("sampler", work, lambda: LONG, threading.Event())
    worker.wake_event = RecordingEvent()
    worker.start()
    try:
        assert work.ran[1].wait(TIMEOUT) and slept.wait(TIMEOUT)
        assert len(waits) == 1 and waits[0] is not None and waits[0] > LONG - 60
        assert worker.health() == Health(True, "ok")
    finally:
        worker.stop_event.set()
        worker.wake()
        worker.join(TIMEOUT)
    assert not worker.is_alive() and work.calls == 1
