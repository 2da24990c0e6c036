"""Virtual time for the code that takes a clock (the fault tracker, the agent's workers)."""

from __future__ import annotations


class ManualClock:
    """A clock that moves only when the test moves it: `advance`, or `now` set."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
