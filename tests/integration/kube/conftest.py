"""A real HTTP Kubernetes API for the tests: kmock's KubernetesEmulator on loopback, run on
its own event loop in a thread so that the agent's (synchronous) kubernetes client talks to it
exactly as to a real API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster

kmock = pytest.importorskip("kmock")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.close()
