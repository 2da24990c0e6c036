"""ResourceClaims whose fields have the wrong JSON type (the emulated API stores what it is
given; a newer API version or a buggy controller can too): each is read on its own. In a
NodePrepareResources batch it gets its own answer in our words and the others are prepared;
anywhere in the cluster it is skipped by every list and watch, said once (a log line and
nodeagent_kube_objects_skipped_total), and the agent starts and serves."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.metrics.kube import KUBE_REQUESTS
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.integration.dra.test_agent_dra import _agent
from tests.support.cli import captured_logs
from tests.support.dra import (
    CLAIMS,
    DRIVER,
    NODE,
    DraCluster,
    DraNode,
    allocated_claim,
    dra_cluster,
    mps_config,
)
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet

RESULT = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}
CONFIG = mps_config(25)[0]

# (the field set, its value, the field the answer names, what it says that field is)
MALFORMED: list[tuple[str, Any, str, str]] = [
    ("status.allocation.devices", [{"results": [RESULT]}], "status.allocation.devices", "is a list, not an object"),
    ("status.allocation.devices.results", "gpu-1", "status.allocation.devices.results", "is a string, not a list"),
    ("status.allocation.devices.results", ["gpu-1"], "status.allocation.devices.results[0]", "is a string, not an object"),
    ("status.allocation", "allocated", "status.allocation", "is a string, not an object"),
    ("status", [], "status", "is a list, not an object"),
    ("metadata", ["speech", "bad"], "metadata", "is a list, not an object"),
    ("metadata.uid", 7, "metadata.uid", "is a number, not a string"),
    ("status.allocation.devices.config", {"opaque": {}}, "status.allocation.devices.config", "is an object, not a list"),
    ("status.allocation.devices.config", [{**CONFIG, "opaque": "mps"}], "status.allocation.devices.config[0].opaque", "is a string, not an object"),
    ("status.allocation.devices.config", [{**CONFIG, "requests": "gpu"}], "status.allocation.devices.config[0].requests", "is a string, not a list"),
    ("status.allocation.devices.results", [{**RESULT, "device": 1}], "status.allocation.devices.results[0].device", "is a number, not a string"),
    ("status.allocation.devices.results", [{**RESULT, "adminAccess": "true"}], "status.allocation.devices.results[0].adminAccess", "is a string, not true or false"),
    ("status.allocation.devices.results", [{**RESULT, "consumedCapacity": ["25"]}], "status.allocation.devices.results[0].consumedCapacity", "is a list, not an object"),
    ("status.allocation.devices.results", [{**RESULT, "bindingConditions": "Ready"}], "status.allocation.devices.results[0].bindingConditions", "is a string, not a list"),
    ("status.devices", "ready", "status.devices", "is a string, not a list"),
    ("status.devices", [3], "status.devices[0]", "is a number, not an object"),
    ("status.devices", [{"driver": DRIVER, "conditions": {"type": "Ready"}}], "status.devices[0].conditions", "is an object, not a list"),
]  # fmt: skip
PYTHON_WORDS = ("internal error", "attribute", "Error", "object has no", "'str'", "'list'")


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


def _malformed(name: str, uid: str, field: str, value: Any) -> dict[str, Any]:
    claim = allocated_claim(name, uid, {"gpu": "gpu-1"})
    return _set(claim, field, value)


@pytest.mark.parametrize(("field", "value", "named", "says"), MALFORMED)
def test_a_malformed_claim_in_a_batch_gets_its_own_answer(
    dra_node: DraNode, field: str, value: Any, named: str, says: str
) -> None:
    good = dra_node.add_claim(allocated_claim("asr", "uid-good", {"gpu": "gpu-0-mig-1g18gb-19-3"}))
    bad_claim = _malformed("bad", "uid-bad", field, value)
    dra_node.cluster.km.objects[CLAIMS, "speech", "bad"] = bad_claim
    bad = Claim("speech", "bad", "uid-bad")

    answers = dra_node.kubelet.prepare([bad, good])

    assert answers["uid-good"].error == ""
    assert [d.device for d in answers["uid-good"].devices] == ["gpu-0-mig-1g18gb-19-3"]
    assert answers["uid-bad"].error == f"claim speech/bad: {named} {says}"
    assert not any(word in answers["uid-bad"].error for word in PYTHON_WORDS)
    assert answers["uid-bad"].devices == ()
    # Nothing was made or held for it: GPU 1 is as it was, the checkpoint has the good one.
    assert dra_node.layout(1) == []
    assert "uid-bad" not in dra_node.checkpoint.read_text()
    assert dra_node.claim("speech", "bad") == bad_claim  # no status written into it


def _sample(agent: Agent, name: str, labels: dict[str, str]) -> float | None:
    value: float | None = agent.registry.get_sample_value(name, labels)
    return value


@pytest.mark.parametrize(("field", "value", "named", "says"), MALFORMED[:6])
def test_a_malformed_claim_anywhere_in_the_cluster_is_skipped_and_said_once(
    short_root: Path,
    field: str,
    value: Any,
    named: str,
    says: str,
) -> None:
    """`run --kube --dra` starts (it exited 4, internal error: AttributeError), its binding
    watcher keeps listing and watching, and the claim allocated here is still rebuilt into
    the ownership record."""
    cluster = dra_cluster()
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    name = f"bad-{uuid.uuid4().hex[:8]}"
    bad_claim = _malformed(name, f"uid-{name}", field, value)
    if named != "metadata":
        bad_claim["metadata"]["namespace"] = "elsewhere"
    cluster.km.objects[CLAIMS, "elsewhere", name] = bad_claim
    good = allocated_claim("asr", "uid-good", {"gpu": "gpu-0"})
    cluster.km.objects[CLAIMS, "speech", "asr"] = good
    lib = SimulatedNvml(parse_spec("h200x2"))
    agent = _agent(short_root, cluster, lib, NvmlSession(lib), dra=True)
    with captured_logs("info") as events:
        _run(agent, cluster, short_root)
    exposition = agent.exposition.latest().decode()
    field_label = named.replace("[0]", "[]")
    if named != "metadata":
        assert (
            f'nodeagent_kube_object_unreadable{{field="{field_label}",name="{name}",'
            f'namespace="elsewhere",resource="resourceclaims"}} 1.0'
        ) in exposition
    assert (
        f'nodeagent_kube_objects_skipped_total{{field="{field_label}",resource="resourceclaims"}}'
        in exposition
    )
    said = [e["error"] for e in events if e["event"] == "kube.object_skipped"]
    assert len([e for e in said if f"{named} {says}" in e]) == 1, said


def _claim_lists() -> int:
    return sum(
        n
        for (verb, resource, _), n in KUBE_REQUESTS.counts().items()
        if (verb, resource) == ("list", "resourceclaims")
    )


def _run(agent: Agent, cluster: DraCluster, root: Path) -> None:
    lists = _claim_lists()
    try:
        agent.start()
        # The binding watcher listed the claims, and lists them again (after its watch
        # expired): the claim is not said again, the worker never failed.
        cluster.wait(lambda: _claim_lists() >= lists + 1, what="the claims listed")
        # The rebuilt ownership record holds the good claim, allocated here.
        assert "uid-good" in agent.owners.read().claims
        kubelet = FakeDraKubelet(root / "reg")
        kubelet.register(DRIVER)
        assert kubelet.prepare([Claim("speech", "asr", "uid-good")])["uid-good"].error == ""
        assert agent.workers["dra-bind"].errors == 0
    finally:
        agent.stop()
        cluster.close()
