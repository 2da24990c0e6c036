"""A share claim held below its request while another bursts (issue 45): on the emulated node
with the DRA plugin and fake MPS, two share claims' clients run, NVML's per-process samples put
the SM use on them, and the share watch says HeldBelowRequest of the one held under its request
- after three looks in a row, never at the first - as a condition on the claim, a Warning Event
and the metrics; the bursting claim is within its share and said nothing of."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.dra.sharewatch import BELOW_LOOKS, ShareWatch
from nodeagent.metrics.dra import DraStats
from nodeagent.metrics.shares import ShareCollector
from nodeagent.state.sampling import UtilizationSampler
from nodeagent.state.snapshot import Store
from tests.integration.dra.conftest import dra_node, short_root  # noqa: F401 (fixtures)
from tests.integration.dra.test_share_servers import _client, env_of, prepared, share
from tests.support.dra import DRIVER, DraNode

kmock = pytest.importorskip("kmock")
GIB = 1 << 30


def _conditions(node: DraNode, name: str) -> list[dict[str, Any]]:
    claim = node.claim("speech", name)
    return [
        c
        for e in claim["status"].get("devices", [])
        for c in e.get("conditions", [])
        if c["type"] == "ShareLimits"
    ]


def test_a_claim_held_below_its_request_while_another_bursts_is_a_finding(
    dra_node: DraNode,  # noqa: F811
) -> None:
    from nodeagent.dra.k8s.api import DraApi
    from nodeagent.dra.k8s.reports import StatusReports
    from nodeagent.kube.api import KubeSettings, make_api_client

    prepared(
        dra_node,
        share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi"),
        share("tts", "uid-tts", "gpu-0-mps", 20, "8Gi"),
    )
    asr, tts = _client(env_of(dra_node, "uid-asr")), _client(env_of(dra_node, "uid-tts"))
    try:
        # asr is busy but gets 20 % of the SMs; tts takes 75 % on a request of 20.
        dra_node.lib.attach("0", asr.pid, GIB, load=0.2, mps_client=True)
        dra_node.lib.attach("0", tts.pid, 2 * GIB, load=0.75, mps_client=True)
        node = dra_node.node
        node.shares.clients = lambda key: [asr.pid, tts.pid]  # type: ignore[method-assign]
        store = Store(dra_node.session, time.time)
        store.observe()
        UtilizationSampler(dra_node.session, store).tick()
        stats = DraStats(lambda: store.utilization)
        kube = KubeSettings(node_name="node-1", host=dra_node.cluster.url, retry_seconds=1.0)
        api = DraApi(make_api_client(kube), kube)
        watch = ShareWatch(node, StatusReports(api, DRIVER, "node-1"), api, stats)
        registry = CollectorRegistry()
        registry.register(ShareCollector(stats))

        def look() -> set[tuple[str, str]]:
            watch._next = 0.0
            return {(f.claim, f.reason) for f in watch.tick(dra_node.inventory())}

        for _ in range(BELOW_LOOKS - 1):  # not yet: one sample is no finding
            assert look() == {("uid-asr", "WithinShare"), ("uid-tts", "WithinShare")}
        assert _conditions(dra_node, "asr") == []
        assert look() == {("uid-asr", "HeldBelowRequest"), ("uid-tts", "WithinShare")}

        (condition,) = _conditions(dra_node, "asr")
        assert (condition["status"], condition["reason"]) == ("False", "HeldBelowRequest")
        assert condition["message"].startswith(
            "its clients got 20 % of the SMs, below its request of 30 %, while claim speech/tts"
            " took 75 % (request 20 %)"
        )
        assert _conditions(dra_node, "tts") == []
        events = [
            dict(o)
            for (r, _, _), o in list(dra_node.cluster.km.objects.items())
            if "events" in str(r) and not o.deleted
        ]
        assert {(e["involvedObject"]["name"], e["reason"], e["type"]) for e in events} == {
            ("asr", "HeldBelowRequest", "Warning")
        }
        assert dict(stats.share_findings) == {"HeldBelowRequest": 1}
        assert stats.shares_over == 0  # held below is not over its share

        def gauge(name: str, claim: str) -> float | None:
            labels = {"claim": claim, "namespace": "speech", "device": "gpu-0-mps"}
            return registry.get_sample_value(f"nodeagent_dra_share_{name}", labels)

        assert (gauge("held_below_request", "asr"), gauge("held_below_request", "tts")) == (1, 0)
        assert (gauge("sm_achieved_percent", "asr"), gauge("sm_achieved_percent", "tts")) == (
            20, 75
        )  # fmt: skip
        assert gauge("memory_used_bytes", "tts") == 2 * GIB
        assert gauge("sm_request_percent", "tts") == 20
    finally:
        for p in (asr, tts):
            p.kill()
            p.wait()
