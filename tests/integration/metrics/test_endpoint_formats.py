"""A scrape gets the format it asks for: OpenMetrics when its Accept header negotiates it,
gzip when its Accept-Encoding accepts it, the text format otherwise; every format from one
collect per change. Asked as Prometheus asks (its Accept headers, and a real Prometheus)."""

from __future__ import annotations

import gzip
import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from nodeagent.agent.service import Agent
from nodeagent.metrics.exposition import ExpositionCache, Format
from nodeagent.metrics.server import MetricsServer
from tests.integration.metrics.test_dcgm import build
from tests.support.metrics import http_get, prometheus_server, prometheus_tool, sample, wait_for

TIMEOUT = 10.0
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# What Prometheus sends (scrape/scrape.go): 2.x, and 3.x with its UTF-8 escaping.
PROMETHEUS_2 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # fmt: skip
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
                "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")  # fmt: skip
PROMETHEUS_ENCODING = "gzip"


@pytest.fixture
def agent() -> Iterator[Agent]:
    """An emulated H200 with the dcgm-compat families (counters without _total) on."""
    made, _lib, _session = build("h200", None)
    sample(made)
    yield made
    made.stop()


@pytest.fixture
def server(agent: Agent) -> Iterator[MetricsServer]:
    srv = MetricsServer("127.0.0.1:0", agent.exposition.latest, lambda: (True, "ok"),
                        lambda: (True, "ok"), cached=agent.exposition.fresh)  # fmt: skip
    srv.start()
    yield srv
    srv.stop()


def get(port: int, method: str = "GET", **headers: str) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request(method, "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp, resp.read()
    finally:
        conn.close()


def series(text: str) -> list[str]:
    """Each sample line's series name, as the scraper stores it."""
    return sorted(x.split("{")[0].split(" ")[0] for x in text.splitlines()
                  if x and not x.startswith("#"))  # fmt: skip


@pytest.mark.parametrize(
    "accept", [PROMETHEUS_2, PROMETHEUS_3], ids=["prometheus-2", "prometheus-3"]
)
def test_prometheus_gets_openmetrics_gzipped_with_the_same_series(
    server: MetricsServer, accept: str
) -> None:
    resp, body = get(server.port, Accept=accept, **{"Accept-Encoding": PROMETHEUS_ENCODING})
    assert resp.status == 200
    assert resp.getheader("Content-Type") == OPENMETRICS
    assert resp.getheader("Content-Encoding") == "gzip"
    assert resp.getheader("Content-Length") == str(len(body))
    assert "Accept-Encoding" in (resp.getheader("Vary") or "")
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}  # strict: raises
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"  # name kept
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    plain_resp, plain = get(server.port)
    assert plain_resp.getheader("Content-Type") == CONTENT_TYPE_LATEST
    assert plain_resp.getheader("Content-Encoding") is None
    assert series(text) == series(plain.decode())  # every series, by the same name
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in series(text)


@pytest.mark.parametrize(
    ("headers", "content_type", "gzipped"),
    [
        ({}, CONTENT_TYPE_LATEST, False),
        ({"Accept": "*/*"}, CONTENT_TYPE_LATEST, False),
        ({"Accept-Encoding": "gzip, deflate"}, CONTENT_TYPE_LATEST, True),
        ({"Accept-Encoding": "identity"}, CONTENT_TYPE_LATEST, False),
        ({"Accept": "application/openmetrics-text"}, OPENMETRICS, False),
        ({"Accept": "application/openmetrics-text; version=0.0.1"}, CONTENT_TYPE_LATEST, False),
        # versions prometheus_client cannot compare: the text format, not a 500
        ({"Accept": "application/openmetrics-text;version=1.x"}, CONTENT_TYPE_LATEST, False),
        ({"Accept": "application/openmetrics-text;version=abc"}, CONTENT_TYPE_LATEST, False),
    ],
    ids=["none", "any", "gzip", "identity", "openmetrics", "old-openmetrics", "bad-version",
         "words-version"],
)  # fmt: skip
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_what_each_accept_header_gets(
    server: MetricsServer, method: str, headers: dict[str, str], content_type: str, gzipped: bool
) -> None:
    resp, body = get(server.port, method, **headers)
    _, full = get(server.port, "GET", **headers)  # what GET sends, for HEAD's length
    assert resp.status == 200
    assert resp.getheader("Content-Type") == content_type
    assert resp.getheader("Content-Encoding") == ("gzip" if gzipped else None)
    assert resp.getheader("Content-Length") == str(len(full))
    assert body == (b"" if method == "HEAD" else full)
    text = (gzip.decompress(full) if gzipped else full).decode()
    assert "nodeagent_gpu_info{" in text


class Counting:
    """A collector that counts its collects."""

    def __init__(self) -> None:
        self.collects = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.collects += 1
        yield GaugeMetricFamily("value", "A value.", value=self.collects)


FORMATS = [Format(openmetrics=om, gzip=gz) for om in (False, True) for gz in (False, True)]


def test_every_format_comes_from_one_collect_per_change() -> None:
    registry, counting = CollectorRegistry(), Counting()
    registry.register(counting)
    cache = ExpositionCache(registry)
    first = {fmt: cache.latest(fmt) for fmt in FORMATS}
    assert counting.collects == 1
    assert all(cache.fresh(fmt) is first[fmt] for fmt in FORMATS)  # answered on the loop
    assert all(cache.latest(fmt) is first[fmt] for fmt in FORMATS)  # no render again
    assert gzip.decompress(first[Format(openmetrics=True, gzip=True)]) == first[Format(True)]
    cache.changed()
    assert all(cache.fresh(fmt) is None for fmt in FORMATS)
    after = {fmt: cache.latest(fmt) for fmt in FORMATS}
    assert counting.collects == 2
    assert b"value 2.0" in after[Format()]


def test_a_real_prometheus_scrapes_openmetrics_gzipped(agent: Agent, tmp_path: Path) -> None:
    """Prometheus negotiates OpenMetrics and gzip, and stores the dcgm-compat counter under
    dcgm-exporter's name."""
    binary = prometheus_tool("prometheus")
    asked: list[Format] = []

    def exposition(fmt: Format) -> bytes:
        asked.append(fmt)
        return agent.exposition.latest(fmt)

    srv = MetricsServer("127.0.0.1:0", exposition, lambda: (True, "ok"), lambda: (True, "ok"))
    srv.start()
    config = (
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
        f"  - job_name: nodeagent\n    static_configs: [{{targets: ['127.0.0.1:{srv.port}']}}]\n"
    )
    try:
        with prometheus_server(binary, tmp_path, config) as base:

            def query(promql: str) -> list[dict[str, object]]:
                url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
                status, body = http_get(url)
                return json.loads(body)["data"]["result"] if status == 200 else []  # type: ignore[no-any-return]

            wait_for(lambda: query('up{job="nodeagent"} == 1'), "the target up")
            assert wait_for(
                lambda: query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), "the energy counter"
            )
            assert wait_for(lambda: query("nodeagent_gpu_info"), "the agent's own families")
            assert Format(openmetrics=True, gzip=True) in asked
    finally:
        srv.stop()
