"""Which pod holds each GPU, MIG slice and replica: the attribution series from a kubelet
pod-resources server (golden exposition, promtool), gone when the pod goes, kept from the last
answer while the kubelet cannot be asked; and the documented PromQL against a real Prometheus."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import grpc
import pytest

from nodeagent.agent.service import Agent
from nodeagent.kubelet.podresources import pod_devices
from nodeagent.mig.config import parse_config
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.integration.metrics.test_exposition import GOLDEN, exposition, stable
from tests.integration.metrics.test_prometheus import _query, prometheus  # noqa: F401
from tests.support.agent import SteppedClock, make_agent
from tests.support.fake_kubelet.podresources import FakePodResources, pod, serve
from tests.support.metrics import GIB, http_get, prometheus_tool, sample, wait_for
from tests.support.mig_apply import reconfigure

# GPU 0 in MIG (one 3g, one 2g, two 1g), GPUs 1 and 2 whole: one for a pod, one shared.
MIG_CONFIG = """\
version: v1
mig-configs:
  pods:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}
    - devices: [1, 2]
      mig-enabled: false
"""
GHOST = "GPU-00000000-0000-0000-0000-000000000000"


def build_node() -> tuple[SimulatedNvml, NvmlSession, dict[str, str]]:
    """The node, with load, and its device ids by role: 3g, 2g, 1g-a, 1g-b, whole, shared."""
    lib = SimulatedNvml(parse_spec("h200x3"))
    session = NvmlSession(lib)
    reconfigure(session, parse_config(MIG_CONFIG, "pods.yaml"), "pods", lib.reset)
    gpus = read_inventory(session).gpus
    ones = [s.mig_uuid or "" for s in gpus[0].slices if s.profile == "1g.18gb"]
    ids = {
        "3g": next(s.mig_uuid or "" for s in gpus[0].slices if s.profile == "3g.71gb"),
        "2g": next(s.mig_uuid or "" for s in gpus[0].slices if s.profile == "2g.35gb"),
        "1g-a": ones[0],
        "1g-b": ones[1],
        "whole": gpus[1].uuid,
        "shared": gpus[2].uuid,
    }
    for pid, (role, gib) in enumerate([("3g", 20), ("1g-a", 5), ("whole", 60), ("shared", 9)]):
        lib.attach(ids[role], 600 + pid, gib * GIB, 0.5)
    return lib, session, ids


def kubelet_pods(ids: dict[str, str]) -> list[object]:
    """Pods on MIG slices, a whole GPU and replicas, plus what must be left out: a device the
    node does not have, a non-NVIDIA resource, a container without devices."""
    mig, gpu = "nvidia.com/mig-", "nvidia.com/gpu"
    shared = ids["shared"]
    return [
        pod("speech", "asr-0", {"server": {f"{mig}3g.71gb": [ids["3g"]]}}),
        pod(
            "speech",
            "tts-0",
            {"main": {f"{mig}1g.18gb": [ids["1g-a"]]}, "proxy": {"example.com/nic": ["eth7"]}},
        ),
        # A time-sliced MIG slice: two replicas in one container are the slice once.
        pod(
            "search",
            "embed-1",
            {"main": {f"{mig}1g.18gb": [f"{ids['1g-b']}::0", f"{ids['1g-b']}::1"]}},
        ),
        pod("search", "rerank-0", {"main": {f"{mig}1g.18gb": [f"{ids['1g-b']}::2"]}}),
        pod("llm", "vllm-0", {"engine": {gpu: [ids["whole"]]}}),
        pod("guard", "guard-a", {"main": {gpu: [f"{shared}::0", f"{shared}::1"]}}),
        pod(
            "guard", "guard-b", {"main": {gpu: [f"{shared}::10"]}, "side": {gpu: [f"{shared}::3"]}}
        ),
        pod("gone", "elsewhere", {"main": {gpu: [GHOST, f"{GHOST}::1"]}}),
    ]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Agent, FakePodResources, dict[str, str]]]:
    socket = tmp_path / "kubelet.sock"
    lib, session, ids = build_node()
    with serve(socket) as kubelet:
        kubelet.pods = kubelet_pods(ids)  # type: ignore[assignment]
        agent = make_agent(
            session, lib.reset, allocations=lambda: pod_devices(socket), monotonic=SteppedClock()
        )
        sample(agent)
        yield agent, kubelet, ids
        agent.stop()


def test_golden_exposition_with_pods(node: tuple[Agent, FakePodResources, dict[str, str]]) -> None:
    agent, kubelet, _ = node
    got = stable(exposition(agent))
    path = GOLDEN / "metrics-h200x3-pods.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()
    assert kubelet.calls == 1  # one List per refresh
    proc = subprocess.run(
        [prometheus_tool("promtool"), "check", "metrics"],
        input=got,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (
        proc.stdout + proc.stderr
    )


def _holders(agent: Agent, series: str) -> set[tuple[str, str, str]]:
    return {
        (s.labels["namespace"], s.labels["pod"], s.labels["container"])
        for family in agent.registry.collect()
        if family.name == series
        for s in family.samples
    }


def test_series_go_when_the_pod_goes(node: tuple[Agent, FakePodResources, dict[str, str]]) -> None:
    agent, kubelet, ids = node
    value = agent.registry.get_sample_value
    used = {"gpu": "0", "profile": "1g.18gb", "state": "used"}
    assert value("nodeagent_gpu_slices", used) == 2.0  # 1g-b: no process, held by pods
    gone = ("tts-0", "guard-b", "embed-1", "rerank-0")
    kubelet.pods = [p for p in kubelet.pods if p.name not in gone]
    agent.refresh()
    assert _holders(agent, "nodeagent_slice_pod_info") == {("speech", "asr-0", "server")}
    assert _holders(agent, "nodeagent_gpu_pod_info") == {
        ("llm", "vllm-0", "engine"),
        ("guard", "guard-a", "main"),
    }
    assert value("nodeagent_gpu_slices", used) == 1.0
    assert agent.store.snapshot is not None
    assert ids["1g-b"] not in agent.store.snapshot.allocated


def test_a_kubelet_error_keeps_the_last_answer(
    node: tuple[Agent, FakePodResources, dict[str, str]],
) -> None:
    agent, kubelet, _ = node
    before = stable(exposition(agent))
    kubelet.error = grpc.StatusCode.UNAVAILABLE
    agent.refresh()
    snap = agent.store.snapshot
    assert snap is not None and snap.allocations_error is not None
    assert "UNAVAILABLE" in snap.allocations_error
    assert stable(exposition(agent)) == before  # attribution and in-use counts as last answered
    kubelet.error = None
    kubelet.pods = []
    agent.refresh()
    assert not _holders(agent, "nodeagent_slice_pod_info")
    assert not _holders(agent, "nodeagent_gpu_pod_info")
    assert agent.store.snapshot is not None and agent.store.snapshot.allocations_error is None


README = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def documented_queries() -> list[str]:
    """The queries of README's "memory used per pod" block (Metrics), as written there."""
    text = README.read_text()
    block = text[text.index("```promql\n", text.index("**Which pod holds what.**")) + 10 :]
    block = block[: block.index("```")]
    return [" ".join(q.split()) for q in block.split("\n\n") if q.strip()]


ONE_HOLDER_PER_SLICE = (
    "nodeagent_slice_memory_used_bytes * on(gpu, gi_id, ci_id)"
    " group_left(namespace, pod, container) nodeagent_slice_pod_info"
)


@pytest.fixture
def running_agent(tmp_path: Path) -> Iterator[tuple[Agent, SimulatedNvml]]:
    """Overrides test_prometheus's agent: this node, its kubelet, refreshed every 0.2 s."""
    socket = tmp_path / "kubelet.sock"
    lib, session, ids = build_node()
    with serve(socket) as kubelet:
        kubelet.pods = kubelet_pods(ids)  # type: ignore[assignment]
        agent = make_agent(
            session,
            lib.reset,
            allocations=lambda: pod_devices(socket),
            metrics={"refresh_interval_seconds": 0.2, "gpm_interval_seconds": 0.2},
        )
        agent.start()
        yield agent, lib
        agent.stop()


def test_memory_per_pod_in_prometheus(
    prometheus: str,  # noqa: F811
    running_agent: tuple[Agent, SimulatedNvml],
) -> None:
    per_container_slice, per_pod_query = documented_queries()
    agent, _ = running_agent
    snap = agent.store.snapshot
    assert snap is not None
    gpus = snap.inventory.gpus
    used = {s.mig_uuid: s.memory_used_bytes for s in gpus[0].slices}
    used.update({g.uuid: g.memory_used_bytes for g in gpus})
    assert GHOST in {device_id.split("::")[0] for device_id in snap.holders}  # left out below
    want: dict[tuple[str, str], float] = {}
    for device_id, h in snap.holders.items():
        uuid = device_id.split("::")[0]
        if uuid in used:
            want[(h.namespace, h.pod)] = float(used[uuid])  # one device per pod in this layout
    assert len(want) == 7 and len(set(want.values())) > 2  # pods on distinct, loaded devices

    def per_pod() -> dict[tuple[str, str], float]:
        rows = _query(prometheus, per_pod_query)
        return {(r["metric"]["namespace"], r["metric"]["pod"]): float(r["value"][1]) for r in rows}

    # A shared GPU's or slice's memory counts for each pod holding it, once per pod.
    wait_for(lambda: per_pod() == want, f"memory per pod {want}")
    rows = _query(prometheus, per_container_slice)
    assert {(r["metric"]["pod"], r["metric"]["container"]) for r in rows} == {
        ("asr-0", "server"),
        ("tts-0", "main"),
        ("embed-1", "main"),
        ("rerank-0", "main"),
    }
    # The one-holder form (value series on the left) works where each slice has one holder.
    one = ONE_HOLDER_PER_SLICE.replace(
        "nodeagent_slice_pod_info", 'nodeagent_slice_pod_info{namespace="speech"}'
    )
    single = {(r["metric"]["pod"], float(r["value"][1])) for r in _query(prometheus, one)}
    assert single == {("asr-0", want[("speech", "asr-0")]), ("tts-0", want[("speech", "tts-0")])}
    # ... and Prometheus refuses it where two pods share a slice (search's 1g): README says so.
    status, body = http_get(
        f"{prometheus}/api/v1/query?" + urlencode({"query": ONE_HOLDER_PER_SLICE})
    )
    assert status == 422 and "many-to-many matching not allowed" in body, body
