"""held_lock (nodeagent.base.lock) between threads of one process: they queue on a lock of the
process's own before the file's, so a waiter takes the file's lock as its holder lets go, with
no try of the file's lock on the way (the tries, POLL_SECONDS apart, are for another process's
holder); a waiter that gives up, or is stopped, leaves the queue as it found it."""

from __future__ import annotations

import threading
from pathlib import Path

from nodeagent.base.errors import Interrupted, LockHeld
from nodeagent.base.lock import held_lock


def test_a_thread_waiting_behind_another_takes_the_lock_without_polling(tmp_path: Path) -> None:
    path = tmp_path / "l"
    holding, release = threading.Event(), threading.Event()
    slept: list[float] = []
    order: list[str] = []

    def holder() -> None:
        with held_lock(path, "the lock", "holds", 5):
            holding.set()
            release.wait(5)
            order.append("holder done")

    def waiter() -> None:
        with held_lock(path, "the lock", "holds", 5, sleep=slept.append):
            order.append("waiter has it")

    first = threading.Thread(target=holder)
    first.start()
    assert holding.wait(5)
    second = threading.Thread(target=waiter)
    second.start()
    second.join(0.2)
    assert second.is_alive()  # it waits its turn
    release.set()
    first.join(5)
    second.join(5)
    assert order == ["holder done", "waiter has it"]
    assert slept == []  # no try of the file's lock: the process's own queue handed it over


def test_a_thread_that_gives_up_or_is_stopped_leaves_the_queue_free(tmp_path: Path) -> None:
    path = tmp_path / "l"
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with held_lock(path, "the lock", "holds", 5):
            holding.set()
            release.wait(5)

    def attempt(**kw: object) -> BaseException | None:
        """One try in a worker thread (the main thread takes no turn: signal handlers run
        there); what it raised."""
        out: list[BaseException | None] = [None]

        def body() -> None:
            try:
                with held_lock(path, "the lock", "holds", **kw):  # type: ignore[arg-type]
                    pass
            except BaseException as err:  # the test's to look at
                out[0] = err

        t = threading.Thread(target=body)
        t.start()
        t.join(10)
        return out[0]

    first = threading.Thread(target=holder)
    first.start()
    assert holding.wait(5)
    try:
        gave_up = attempt(timeout_seconds=0.2)
        stopped = attempt(timeout_seconds=5, stopped=lambda: 15)
    finally:
        release.set()
        first.join(5)
    assert isinstance(gave_up, LockHeld) and str(gave_up).endswith("gave up after 0.2 s")
    assert isinstance(stopped, Interrupted)
    assert "stopped by SIGTERM while waiting for the lock" in str(stopped)
    assert attempt(timeout_seconds=0) is None  # free at once: nothing left queued
