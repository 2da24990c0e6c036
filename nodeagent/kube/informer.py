"""One list-and-watch loop for every collection the agent follows (its own Node, the
ResourceClaims allocated to it), as client-go's reflector runs one.

A pass (`Informer.run`, one call of a supervised worker) lists when it has no resourceVersion
to watch from (the first pass, or the watch expired), then watches from that version until
the API server ends the watch (its timeout), keeping the version of every event and bookmark,
so the next pass watches on from there without listing again. The version watched from is
always a list's (the collection's, not an object's: a watch from an object's own version,
older than a restarted API server's watch cache, expires at once, and the pass listed and
expired again in a loop: 605 `get nodes` in the first minute after an outage). A 410 Gone
lists again, once: a second 410 straight after a list waits a jittered backoff first.

A pass that fails (KubeError: the API server down, or an error answer) makes the next one wait
first, a jittered backoff that grows with each failure in a row; the first answer to an
informer of the agent that had failed ends the others' waits (nodeagent.kube.reconnect). So after an
outage a node comes back to the API server at a random moment of the backoff, not at the
moments every other node does, and each collection is listed once.

A watch that ends within SHORT_WATCH_SECONDS with no event (no change, no bookmark) is a failure
too, as client-go's reflector calls it a "very short watch": an API server, or a proxy in front
of it, that answers a watch with 200 and an empty body made the agent watch again at once, some
1,500-2,000 requests a second from every node. Its pass raises ShortWatch (a KubeError, the
worker counts it), and the next pass first waits the same jittered backoff, growing with each
such watch in a row until a watch delivers an event or lasts; the API server answered, so it
says nothing of an outage to the other informers (their pauses are theirs).

Every object is read on its own (`read`, which checks the JSON shape of the fields its
reader uses: nodeagent.base.shapes): one that cannot be read is skipped, said once (a warning
`kube.object_skipped` and nodeagent_kube_objects_skipped_total) and never fails the pass, the
list or the other objects. When the agent stops (`stop`), a pass ends at once: the watch's
socket is shut by NodeApi.interrupt, and no event after the stop is handled.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from nodeagent.base.errors import KubeError
from nodeagent.base.logs import get_logger
from nodeagent.kube.api import WatchExpired
from nodeagent.kube.objects import object_key, read_list, read_object
from nodeagent.kube.reconnect import Reconnect
from nodeagent.metrics.kube import KUBE_SKIPPED, SkippedObjects

log = get_logger("nodeagent.kube")
T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
CHANGES = ("ADDED", "MODIFIED", "DELETED")
RELIST_BACKOFF_SECONDS = 1.0  # the first relist after a relist; doubled each time, jittered
RELIST_BACKOFF_MAX_SECONDS = 60.0
SHORT_WATCH_SECONDS = 1.0  # a watch that ends sooner with no event is a failure (client-go's)


class ShortWatch(KubeError):
    """A watch ended within SHORT_WATCH_SECONDS with no event: the next pass backs off."""


@dataclass(frozen=True)
class Source:
    """Where a collection is read: `list()` answers (objects, the list's resourceVersion)
    and raises KubeError; `watch(version)` yields (event type, object) from `version` and
    raises WatchExpired (410) or KubeError."""

    resource: str  # the plural, as the metrics and logs name it: nodes, resourceclaims
    list: Callable[[], tuple[list[Any], str | None]]
    watch: Callable[[str | None], Iterator[tuple[str, Any]]]


class Handler(Protocol[T_contra]):
    """What a reader does with the objects it could read."""

    def listed(self, objects: Sequence[T_contra]) -> None:
        """A full list: every object there is now (the ones that could be read)."""

    def changed(self, kind: str, obj: T_contra) -> None:
        """One watched change: ADDED, MODIFIED or DELETED."""


def version_of(obj: object) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


class Informer(Generic[T]):
    """Lists and watches `source`, hands `handler` what `read` could read."""

    def __init__(
        self,
        source: Source,
        read: Callable[[dict[str, Any]], T],
        handler: Handler[T],
        stop: threading.Event,
        skipped: SkippedObjects = KUBE_SKIPPED,
        jitter: Callable[[float], float] = lambda cap: random.uniform(0.0, cap),
        reconnect: Reconnect | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.clock = clock
        self.short = 0  # watches in a row that ended at once with no event (ShortWatch)
        self.reconnect = reconnect or Reconnect()
        self.failures = 0  # passes in a row that failed (KubeError)
        self.read = read
        self.handler = handler
        self.stop_event = stop
        self.skipped = skipped
        self.jitter = jitter
        self.version: str | None = None  # of the last list, event or bookmark: watched from
        self.lists = 0
        self.expired = 0  # watches that ended in 410 Gone
        self._fresh = False  # listed, and the watch since has not run: a 410 now would loop

    def run(self, relist: Callable[[], None] | None = None) -> None:
        """One pass: after a failed one, the jittered wait (nodeagent.kube.reconnect); a list
        (`relist`, by default `self.relist`) if there is no version to watch from; then a watch
        until the API server ends it. Raises KubeError (the worker counts it)."""
        if self.failures:
            self.reconnect.pause(self.failures)
        elif self.short:  # the server answered: only a stop ends this wait
            self.stop_event.wait(self.reconnect.delay(self.short))
        if self.stop_event.is_set():
            return
        began = self.reconnect.answers
        try:
            self._pass(relist or self.relist)
        except ShortWatch:
            raise
        except KubeError:
            self.failures += 1
            self._fresh = False  # a 410 after the server was gone is no relist loop
            self.reconnect.failed(began)
            raise

    def _answered(self) -> None:
        """This informer's pass got an answer. After its own failures that says the API server
        is back (the others' waits end); a watch that never failed says nothing of another's
        failures (a 403 on the claims alone keeps its own backoff)."""
        if self.failures:
            self.failures = 0
            log.info("kube.reconnected", resource=self.source.resource)
            self.reconnect.answered()

    def _pass(self, relist: Callable[[], None]) -> None:
        if self.version is None:
            relist()
            self._answered()
        began, events = self.clock(), 0
        try:
            for kind, obj in self.source.watch(self.version):
                events += 1
                self.short = 0
                self._answered()
                if self.stop_event.is_set():
                    return
                self.version = version_of(obj) or self.version
                self._fresh = False
                if kind in CHANGES:
                    self._changed(kind, obj)
            self._answered()  # ended by the server (its timeout) or dropped after its answer
            self._fresh = False
            if not events:
                self._ended_empty(self.clock() - began)
        except WatchExpired:
            self._answered()
            self.expired += 1
            if self._fresh:  # expired straight after a list: the server is not caught up
                self._back_off()
            self.version = None  # listed again at the next pass
            log.info("watch.expired", resource=self.source.resource, expired=self.expired)

    def _ended_empty(self, seconds: float) -> None:
        """A watch ended after `seconds` with no event. Raises ShortWatch when that was
        within SHORT_WATCH_SECONDS (not when the agent stops: its watch is ended on purpose)."""
        if seconds >= SHORT_WATCH_SECONDS or self.stop_event.is_set():
            self.short = 0
            return
        self.short += 1
        raise ShortWatch(
            f"Kubernetes API: watch {self.source.resource} ended after {seconds:.2f} s with no"
            f" event (a very short watch: the API server, or a proxy before it, ends watches at"
            f" once); watching again after a backoff ({self.short} in a row)"
        )

    def _back_off(self) -> None:
        cap = min(RELIST_BACKOFF_SECONDS * 2 ** min(self.expired, 16), RELIST_BACKOFF_MAX_SECONDS)
        self.stop_event.wait(self.jitter(cap))

    def relist(self) -> None:
        """List the collection: the handler hears every object that could be read, and the
        next watch starts from the list's resourceVersion. Raises KubeError."""
        objects, version = self.source.list()
        self.lists += 1
        read = read_list(self.source.resource, objects, self.read, self.skipped)
        self.version, self._fresh = version, True
        self.handler.listed(read)

    def _changed(self, kind: str, obj: object) -> None:
        key = object_key(self.source.resource, obj)
        if kind == "DELETED" and self.skipped.readable(key):
            log.info("kube.object_gone", resource=key[0], namespace=key[1], name=key[2])
        # None: skipped, said once while it stays unreadable
        item = read_object(self.source.resource, obj, self.read, self.skipped, kind != "DELETED")
        if item is not None:
            self.handler.changed(kind, item)
