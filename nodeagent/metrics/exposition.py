"""The exposition, rendered off the scrape path.

prometheus_client renders ~600 series (a 56-slice node) in about 12 ms of CPU, which would be
most of a scrape. The samplers already replace the snapshot at a known moment, so the agent
renders right after each replacement and a scrape only sends the latest bytes.
"""

from __future__ import annotations

import threading

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry


class ExpositionCache:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._body: bytes | None = None

    def render(self) -> bytes:
        """Collect and render now; the result is what scrapes get until the next render."""
        with self._lock:
            body = generate_latest(self.registry)
            self._body = body
            return body

    def latest(self) -> bytes:
        body = self._body
        return body if body is not None else self.render()
