"""The way back to the API server after an outage, shared by the agent's informers (its Node's
and, with --dra, the ResourceClaims').

After a pass that failed (the API server could not be reached, or answered an error), an
informer's next pass first waits `pause`: full jitter, a random wait up to 1 s, 2 s, 4 s, ...
doubling with each failure up to 30 s (tenacity's `wait_random_exponential`; the cap is
client-go's reflector's). The supervised worker's own backoff (1, 2, 4, 8, 16, then 30 s between
tries) had no jitter: every node of a fleet that lost the API server together asked again at the
same moments (1, 3, 7, 15, 31, 61 s after it went away) and came back to it in one instant. The
watch workers now wait 1 s of their own (nodeagent.agent.service.WATCH_BACKOFF_SECONDS); with
the jitter, a fleet's return is spread over the cap.

The first answer to an informer after its own failures (`answered`) ends the other informers'
pauses: the API server is back, so each of them watches again at once (and relists once when
its watch expired: 410), instead of waiting out its own backoff. A claim made during the outage
is then seen as soon as the first of the node's watches is back. `interrupt` (the agent stops)
ends every pause too.
"""

from __future__ import annotations

import threading

from tenacity import RetryCallState, Retrying, wait_random_exponential
from tenacity.wait import wait_base

FIRST_SECONDS = 1.0  # the first pause: up to this; doubled with each failure
MAX_SECONDS = 30.0


class Reconnect:
    """One agent's pauses between failed passes, and the signal that the API server is back."""

    def __init__(
        self, first_seconds: float = FIRST_SECONDS, max_seconds: float = MAX_SECONDS
    ) -> None:
        self.wait: wait_base = wait_random_exponential(multiplier=first_seconds, max=max_seconds)
        self._back = threading.Event()
        self._lock = threading.Lock()
        self.down = False  # a pass failed, and none was answered since
        self.answers = 0  # answers after failures so far: a pass notes it when it begins

    def delay(self, failures: int) -> float:
        """The pause before the pass after `failures` failed ones in a row (0: none)."""
        if failures <= 0:
            return 0.0
        state = RetryCallState(Retrying(), None, (), {})
        state.attempt_number = failures
        return float(self.wait(state))

    def failed(self, began: int | None = None) -> None:
        """A pass could not reach the API server: pauses from now wait their whole time.
        `began`: `answers` when that pass began. Where another informer's pass was answered
        since (the server came back while this pass's request was under way: its 503 or
        its broken connection is of before), the API server is back: nothing is re-armed,
        and the next pause ends at once."""
        with self._lock:
            if began is not None and began != self.answers:
                return
            self.down = True
            self._back.clear()

    def answered(self) -> None:
        """A pass got an answer: the API server is back; every pause ends now."""
        with self._lock:
            if self.down:
                self.down = False
                self.answers += 1
                self._back.set()

    def pause(self, failures: int) -> float:
        """Wait `delay(failures)` seconds, or less when a pass of another informer is answered
        meanwhile or the agent stops (`interrupt`). Returns the seconds it was meant to wait."""
        seconds = self.delay(failures)
        if seconds > 0:
            self._back.wait(seconds)
        return seconds

    def interrupt(self) -> None:
        """The agent stops: every pause ends now, and none waits after."""
        with self._lock:
            self.down = False
            self._back.set()
