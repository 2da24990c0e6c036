"""held_lock (nodeagent.base.lock) between threads of one process: they queue on a lock of the
process's own before the file's, so a waiter takes the file's lock as its holder lets go, with
no try of the file's lock on the way (the tries, POLL_SECONDS apart, are for another process's
holder); a waiter that gives up, or is stopped, leaves the queue as it found it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

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

    first = threading.Thread(target=holder)
    first.start()
    assert holding.wait(5)
    try:
        with (
            pytest.raises(LockHeld, match=r"^holds .* \(pid \d+\); gave up after 0\.2 s$"),
            held_lock(path, "the lock", "holds", 0.2),
        ):
            pass
        with (
            pytest.raises(Interrupted, match="stopped by SIGTERM while waiting for the lock"),
            held_lock(path, "the lock", "holds", 5, stopped=lambda: 15),
        ):
            pass
    finally:
        release.set()
        first.join(5)
    with held_lock(path, "the lock", "holds", 0):  # free at once: nothing left queued
        pass
