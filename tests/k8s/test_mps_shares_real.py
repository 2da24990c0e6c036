"""MPS shares as consumable capacity (KEP-5075, DRAConsumableCapacity, beta in v1.36) against
the real kube-scheduler v1.36.2: the templates of examples/dra/mps-shares.yaml, pods from them
put on one share device while their capacity requests fit (each claim with a shareID and a
consumedCapacity of its own), the next one left pending, the share device's exclusive twin
kept from anybody while a share is allocated; then nodeagent's driver prepares the claims on
the emulated node as the clients of ONE MPS daemon per device (nodeagent.mps.servers), each
claim's consumed capacity its request, its limit (MpsShare smLimit, default 100) its clients'
SM ceiling in its CDI spec, the daemon's limits the largest limit (read back from the (fake)
daemon), which stops after the last claim's unprepare. The scheduler counts requests only:
limits that sum past 100 % do not let a fourth request in."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from nodeagent.agent.factory import dra_driver
from nodeagent.base.units import parse_size
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.devices import resource_slices
from nodeagent.dra.node import NodeConfig, NodeDriver
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.k8s.test_packing_real import DRIVER, REPO, _device_classes, _pod, _wait

EXAMPLE = list(yaml.safe_load_all((REPO / "examples/dra/mps-shares.yaml").read_text()))
SM, MEMORY = f"{DRIVER}/sm", f"{DRIVER}/memory"


def _template(name: str, namespace: str) -> dict[str, Any]:
    (doc,) = [d for d in EXAMPLE if d["kind"] == "ResourceClaimTemplate" and d["metadata"]["name"] == name]  # fmt: skip
    return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}


def _one_1g_slice(namespace: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "examples/dra/claim-templates.yaml").read_text())
    (doc,) = [d for d in docs if d["metadata"]["name"] == "one-1g-slice"]
    return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}


def _node(api: Any, session: NvmlSession, shares: str) -> str:
    from kubernetes import client

    from tests.support.k8s import make_node

    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(api, node)
    wanted = resource_slices(read_inventory(session), node, DRIVER, shares=shares)
    for s in wanted:
        pool = {"name": node, "generation": 1, "resourceSliceCount": len(wanted)}
        client.ResourceV1Api(api).create_resource_slice(
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": s.name}, "spec": {**s.spec, "pool": pool}}
        )  # fmt: skip
    _device_classes(api)
    return node


def _claim_of(api: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's claim (made from its template) once the scheduler allocated it."""
    from kubernetes import client

    raw = client.ResourceV1Api(api).list_namespaced_resource_claim(
        namespace, _preload_content=False
    )
    for c in json.loads(raw.data)["items"]:
        owners = c["metadata"].get("ownerReferences") or []
        if any(o["name"] == pod for o in owners) and (c.get("status") or {}).get("allocation"):
            return dict(c)
    return None


def _result(claim: dict[str, Any]) -> dict[str, Any]:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def _unschedulable(api: Any, namespace: str, pod: str) -> bool:
    from kubernetes import client

    p = client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
    return any(
        c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or []
    )


def _driver(session: NvmlSession, node: str, root: Path, control: str, state: Path) -> NodeDriver:
    """The node's DRA driver (plugin dir root/p, CDI root/cdi) with the fake MPS control."""
    config = NodeConfig(DRIVER, node, root / "p", root / "cdi", mps_control=control)
    return dra_driver(
        session, Settings(), config, lambda i: None, state.with_name(".sim.json.lock")
    )


def _prepare(driver: NodeDriver, claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    driver.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)


def _limits(control: str, root: Path) -> tuple[float, int]:
    """The claim's MPS daemon's own answer: its thread percentage and device 0's pinned limit."""
    mps = MpsControl(control, root / "pipe", root / "log")
    pct = float(mps.command("get_default_active_thread_percentage"))
    return pct, parse_size(mps.command("get_default_device_pinned_mem_limit 0"))


def _visible(control: str, root: Path) -> str:
    pid = MpsControl(control, root / "pipe", root / "log").daemon_pid()
    assert pid is not None
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (visible,) = [e for e in env if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
    return visible.split(b"=", 1)[1].decode()


def _quit_all(control: str, plugin_dir: Path) -> None:
    from tests.support.dra import quit_mps

    for d in [*(plugin_dir / "mps").glob("*/*"), *_share_roots(plugin_dir)]:
        quit_mps(control, d)


def _share_roots(plugin_dir: Path) -> list[Path]:
    """The share servers (nodeagent.mps.servers): <plugin dir>/mps-shared/<device>-u<uid>."""
    return sorted(p for p in (plugin_dir / "mps-shared").glob("*") if p.is_dir())


def _spec_env(cdi_dir: Path, uid: str) -> dict[str, str]:
    """The environment the claim's CDI spec gives its one device's containers."""
    (spec,) = cdi_dir.glob(f"*claim_{uid}.json")
    (device,) = json.loads(spec.read_text())["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def _allocated(
    api_client: Any, namespace: str, node: str, template: str, pods: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`pods` made on `node` from the claim template `template`, each with a claim of its own:
    their claims and allocation results, once the scheduler allocated every claim."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    for pod in pods:
        core.create_namespaced_pod(
            namespace, _pod(pod, node, {"resourceClaimTemplateName": template})
        )
    claims = _wait(
        f"{len(pods)} claims allocated",
        lambda: all(c := [_claim_of(api_client, namespace, p) for p in pods]) and c,
    )
    return claims, [_result(c) for c in claims]


def test_three_30_percent_shares_fit_one_gpu_a_fourth_waits(
    api_client: Any, namespace: str, short_tmp: Path, fake_mps_control: str
) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    state = short_tmp / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200"), state))
    node = _node(api_client, session, "gpus")
    res.create_namespaced_resource_claim_template(namespace, _template("mps-30", namespace))
    res.create_namespaced_resource_claim_template(
        namespace,
        {"metadata": {"name": "whole"},
         "spec": {"spec": {"devices": {"requests": [
             {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}},
    )  # fmt: skip
    pods = ["asr-0", "asr-1", "asr-2"]
    claims, results = _allocated(api_client, namespace, node, "mps-30", pods)
    assert {r["device"] for r in results} == {"gpu-0-mps"}, results
    assert len({r["shareID"] for r in results}) == 3, results
    assert all(r["consumedCapacity"] == {SM: "30", MEMORY: "16Gi"} for r in results), results

    # 90 % are taken: a fourth 30 % share does not fit; the GPU is nobody's whole, and none
    # of its MIG slices can be had either (v1.36 takes the share device's counters, all of
    # the GPU's, at its first allocation: the 10 % left cannot be expressed as room for a 1g).
    res.create_namespaced_resource_claim_template(namespace, _one_1g_slice(namespace))
    waiting = {"asr-3": "mps-30", "llm": "whole", "asr-small": "one-1g-slice"}
    for pod, template in waiting.items():
        core.create_namespaced_pod(
            namespace, _pod(pod, node, {"resourceClaimTemplateName": template})
        )
    for pod in waiting:
        _wait(f"{pod} unschedulable", lambda p=pod: _unschedulable(api_client, namespace, p))
        assert _claim_of(api_client, namespace, pod) is None

    driver = _driver(session, node, short_tmp, fake_mps_control, state)
    try:
        for c in claims:
            _prepare(driver, c)
        # One MPS server for the three claims (nodeagent.mps.servers), three limit sets in
        # three CDI specs; the daemon's limits are the ceiling (the largest limit: no smLimit
        # anywhere, the default, 100 %: each 30 % request bursts into the idle GPU).
        (root,) = _share_roots(short_tmp / "p")
        gpu = read_inventory(session).gpus[0]
        assert _limits(fake_mps_control, root) == (100.0, 16 << 30)
        assert _visible(fake_mps_control, root) == gpu.uuid
        envs = [_spec_env(short_tmp / "cdi", c["metadata"]["uid"]) for c in claims]
        assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs} == {str(root / "pipe")}
        assert [(e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
                for e in envs] == [("100", "0=16384M")] * 3  # fmt: skip
        assert [e["NODEAGENT_MPS_CLAIM"] for e in envs] == [c["metadata"]["uid"] for c in claims]
        pid = MpsControl(fake_mps_control, root / "pipe", root / "log").daemon_pid()

        driver.unprepare(claims[0]["metadata"]["uid"])  # the others keep the daemon
        assert MpsControl(fake_mps_control, root / "pipe", root / "log").daemon_pid() == pid
        assert _limits(fake_mps_control, root) == (100.0, 16 << 30)
    finally:
        _quit_all(fake_mps_control, short_tmp / "p")
        session.close()

    # The pod goes, its claim with it: the scheduler gives its 30 % to the waiting pod.
    core.delete_namespaced_pod("asr-0", namespace, grace_period_seconds=0)
    fourth = _wait("asr-3's claim allocated", lambda: _claim_of(api_client, namespace, "asr-3"))
    assert _result(fourth)["device"] == "gpu-0-mps"
    assert _unschedulable(api_client, namespace, "llm")
    assert _unschedulable(api_client, namespace, "asr-small")


def test_two_claims_share_one_mig_slice_and_its_one_daemon(
    api_client: Any, namespace: str, short_tmp: Path, fake_mps_control: str
) -> None:
    from kubernetes import client

    res = client.ResourceV1Api(api_client)
    state = short_tmp / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200"), state))
    node = _node(api_client, session, "mig")
    res.create_namespaced_resource_claim_template(namespace, _template("mps-half-1g", namespace))
    pods = ["tts-0", "tts-1"]
    claims, results = _allocated(api_client, namespace, node, "mps-half-1g", pods)
    (device,) = {r["device"] for r in results}
    assert device.startswith("gpu-0-mig-1g18gb-19-") and device.endswith("-mps"), results
    assert len({r["shareID"] for r in results}) == 2, results
    assert all(r["consumedCapacity"] == {SM: "50", MEMORY: "8Gi"} for r in results), results

    driver = _driver(session, node, short_tmp, fake_mps_control, state)
    start = int(device.removesuffix("-mps").rsplit("-", 1)[1])
    try:
        for c in claims:
            _prepare(driver, c)
        (made,) = read_inventory(session).gpus[0].slices  # one slice, made by the first
        assert made.placement.start == start and made.mig_uuid
        (root,) = _share_roots(short_tmp / "p")  # one MPS server on the slice, for both
        assert _limits(fake_mps_control, root) == (100.0, 8 << 30)  # the default limit
        assert _visible(fake_mps_control, root) == made.mig_uuid
        envs = [_spec_env(short_tmp / "cdi", c["metadata"]["uid"]) for c in claims]
        assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs} == {str(root / "pipe")}
        assert {e["NVIDIA_VISIBLE_DEVICES"] for e in envs} == {made.mig_uuid}

        driver.unprepare(claims[0]["metadata"]["uid"])  # the other still shares the slice
        assert [s.mig_uuid for s in read_inventory(session).gpus[0].slices] == [made.mig_uuid]
        driver.unprepare(claims[1]["metadata"]["uid"])  # the last one: the slice goes
        assert read_inventory(session).gpus[0].slices == ()
        assert _share_roots(short_tmp / "p") == []  # the last claim gone: the daemon too
    finally:
        _quit_all(fake_mps_control, short_tmp / "p")
        session.close()


def _limited_template(name: str, sm: int, memory: str, limit: int) -> dict[str, Any]:
    """A share template of `sm` percent and `memory`, its claims capped by an MpsShare smLimit
    of `limit` (the claim's own opaque config: the scheduler copies it into the allocation)."""
    return {
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "share", "exactly": {
                "deviceClassName": f"mps.{DRIVER}",
                "selectors": [{"cel": {"expression":
                    f'device.attributes["{DRIVER}"].shareOf == "gpu"'}}],
                "capacity": {"requests": {SM: str(sm), MEMORY: memory}},
            }}],
            "config": [{"requests": ["share"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare", "smLimit": limit}}}],
        }}},
    }  # fmt: skip


def test_requests_are_what_the_scheduler_counts_limits_summing_past_100_let_no_fourth_in(
    api_client: Any, namespace: str, short_tmp: Path, fake_mps_control: str
) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    state = short_tmp / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200"), state))
    node = _node(api_client, session, "gpus")
    # Three requests of 30 %, each limited at 60 %: the limits sum to 180 %.
    res.create_namespaced_resource_claim_template(
        namespace, _limited_template("burst-30", 30, "16Gi", 60)
    )
    pods = ["asr", "tts", "emb"]
    claims, results = _allocated(api_client, namespace, node, "burst-30", pods)
    assert {r["device"] for r in results} == {"gpu-0-mps"}, results
    assert all(r["consumedCapacity"] == {SM: "30", MEMORY: "16Gi"} for r in results), results

    # A fourth request of 30 % does not fit the 10 % left, whatever the limits say.
    core.create_namespaced_pod(
        namespace, _pod("rerank", node, {"resourceClaimTemplateName": "burst-30"})
    )
    _wait("rerank unschedulable", lambda: _unschedulable(api_client, namespace, "rerank"))
    assert _claim_of(api_client, namespace, "rerank") is None
    pending = core.read_namespaced_pod("rerank", namespace)
    assert pending.status.phase == "Pending"

    driver = _driver(session, node, short_tmp, fake_mps_control, state)
    try:
        for c in claims:
            _prepare(driver, c)
        # Each client's ceiling is its limit, the server's the largest limit; memory stays
        # at the request.
        (root,) = _share_roots(short_tmp / "p")
        envs = [_spec_env(short_tmp / "cdi", c["metadata"]["uid"]) for c in claims]
        assert [(e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
                for e in envs] == [("60", "0=16384M")] * 3  # fmt: skip
        assert _limits(fake_mps_control, root) == (60.0, 16 << 30)
        for c in claims:
            driver.unprepare(c["metadata"]["uid"])
        assert _share_roots(short_tmp / "p") == []
    finally:
        _quit_all(fake_mps_control, short_tmp / "p")
        session.close()
    assert _unschedulable(api_client, namespace, "rerank")
