"""The exposition, rendered when a scrape asks for it and reused until its data change, in the
format the scraper asks for: the text format, or OpenMetrics; gzip-compressed or not.

prometheus_client renders ~600 series (a 56-slice node) in 6-12 ms of CPU. The samplers
replace their values about once a second (GPM) while Prometheus scrapes every 15-60 s, so
rendering after each sample cost far more than rendering on scrape: the agent says when data
changed (`changed()`), and a scrape renders at most once per change and format. The
collectors run once per change whatever the formats asked (their families are kept for the
other formats), and a compressed answer is the compression of that change's render.
"""

from __future__ import annotations

import gzip
import itertools
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from nodeagent.base.logs import get_logger

log = get_logger("nodeagent.metrics")
GZIP_LEVEL = 6  # zlib's default: level 9 costs twice the CPU for a few per cent
# A counter of the dcgm-compat families keeps dcgm-exporter's name in OpenMetrics, where a
# counter's samples must end in _total: it is typed unknown there (same series, same name).
_UNSUFFIXED_COUNTER = re.compile(r"^# TYPE (\S+) counter$", re.MULTILINE)


@dataclass(frozen=True)
class Format:
    """How an exposition is served: OpenMetrics (1.0.0) or the text format, gzip or not."""

    openmetrics: bool = False
    gzip: bool = False

    @property
    def content_type(self) -> str:
        return openmetrics.CONTENT_TYPE_LATEST if self.openmetrics else CONTENT_TYPE_LATEST


TEXT = Format()


def negotiate(accept: str | None, accept_encoding: str | None) -> Format:
    """The format a scrape's Accept and Accept-Encoding headers ask for, as prometheus_client
    chooses it (`choose_encoder`, `gzip_accepted`). OpenMetrics is served as 1.0.0, the one
    version rendered here; an Accept header prometheus_client cannot read gets the text
    format, as one that names neither does."""
    try:
        _encoder, content_type = choose_encoder(accept or "")
    except (TypeError, ValueError):  # a version that is not numbers: 'version=1.x'
        content_type = CONTENT_TYPE_LATEST
    om = content_type.startswith("application/openmetrics-text")
    return Format(openmetrics=om, gzip=gzip_accepted(accept_encoding or ""))


class _Collected:
    """Families collected once, rendered in several formats (generate_latest needs only
    collect())."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class ExpositionCache:
    def __init__(
        self, registry: CollectorRegistry, extra: Callable[[], bytes] | None = None
    ) -> None:
        self.registry = registry
        self.extra = extra  # families rendered outside prometheus_client (dcgm-compat)
        self._lock = threading.Lock()  # one render at a time; the others take the last one
        self._versions = itertools.count(1)
        self._version = 0  # of the data; bumped by changed()
        self._shown: dict[Format, tuple[int, bytes]] = {}  # each format's last render
        self._collected: tuple[int, list[Metric], bytes] = (-1, [], b"")  # families, extra

    def changed(self) -> None:
        """The data behind the exposition changed (a sample, a reconcile): the next scrape
        renders again. Cheap: called by every worker after every tick."""
        self._version = next(self._versions)  # next() of a count is atomic under the GIL

    def latest(self, fmt: Format = TEXT) -> bytes:
        """The exposition of the data as of now in `fmt`: rendered if they changed since the
        last render in `fmt`, else the bytes of that render. While another scrape renders, the
        last render is the answer at once (data one sample older, never a wait behind a
        render: 6-12 ms of CPU at 56 slices); only a format's very first render is waited
        for."""
        if not self._lock.acquire(blocking=False):
            shown = self._shown.get(fmt)
            if shown is not None:
                return shown[1]
            self._lock.acquire()
        try:
            version = self._version  # a change during the render is rendered next time
            return self._render(fmt, version)
        finally:
            self._lock.release()

    def fresh(self, fmt: Format = TEXT) -> bytes | None:
        """The last render in `fmt` when the data have not changed since, else None; never
        waits (the server answers such a scrape on its event loop, without a thread)."""
        shown = self._shown.get(fmt)
        return shown[1] if shown is not None and shown[0] == self._version else None

    def _render(self, fmt: Format, version: int) -> bytes:
        """`fmt`'s bytes as of `version` (the lock held): from the cache, else from the
        uncompressed render (itself from the cache or the families collected once)."""
        shown = self._shown.get(fmt)
        if shown is not None and shown[0] == version:
            return shown[1]
        if fmt.gzip:
            plain = self._render(Format(openmetrics=fmt.openmetrics), version)
            body = gzip.compress(plain, compresslevel=GZIP_LEVEL, mtime=0)
        else:
            families, extra = self._collect(version)
            if fmt.openmetrics:
                om = _Collected(families + self._families(extra))
                body = openmetrics.generate_latest(om)  # type: ignore[no-untyped-call]
            else:
                body = generate_latest(_Collected(families)) + extra  # type: ignore[arg-type,unused-ignore]
        self._shown[fmt] = (version, body)
        return body

    def _collect(self, version: int) -> tuple[list[Metric], bytes]:
        if self._collected[0] != version:
            self._collected = (version, list(self.registry.collect()), self._extra())
        return self._collected[1], self._collected[2]

    def _families(self, extra: bytes) -> list[Metric]:
        try:
            return _openmetrics(extra)
        except ValueError as err:  # the text does not parse: the native families still go out
            log.warning("collector.failed", collector="dcgm", error=repr(err))
            return []

    def _extra(self) -> bytes:
        if self.extra is None:
            return b""
        try:
            return self.extra()
        except Exception as err:  # never fails the scrape: the native families still go out
            log.warning("collector.failed", collector="dcgm", error=repr(err))
            return b""


def _openmetrics(text: bytes) -> list[Metric]:
    """The extra families (text format) as families OpenMetrics renders with their names."""
    if not text:
        return []
    decoded = _UNSUFFIXED_COUNTER.sub(
        lambda m: m.group(0) if m.group(1).endswith("_total") else f"# TYPE {m.group(1)} unknown",
        text.decode(),
    )
    return list(text_string_to_metric_families(decoded))
