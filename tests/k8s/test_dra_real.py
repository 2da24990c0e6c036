"""The README's DeviceClasses and claim templates end to end: the real kube-scheduler (v1.36.2)
allocates from nodeagent's ResourceSlices of an emulated node, then nodeagent's driver prepares
exactly what the scheduler chose on that emulated node (the claims read back from the API
server, as the kubelet's call would have the driver read them), and nothing overlaps."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from nodeagent.agent.factory import dra_driver
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeConfig
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.k8s.test_packing_real import DRIVER, REPO, _device_classes, _pod, _wait

TEMPLATES = list(yaml.safe_load_all((REPO / "examples/dra/claim-templates.yaml").read_text()))


def _template(name: str, namespace: str) -> dict[str, Any]:
    (doc,) = [d for d in TEMPLATES if d["metadata"]["name"] == name]
    return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}


def _publish(api: Any, node: str, session: NvmlSession) -> None:
    from kubernetes import client

    from nodeagent.dra.devices import resource_slices

    wanted = resource_slices(read_inventory(session), node, DRIVER)
    for s in wanted:
        pool = {"name": node, "generation": 1, "resourceSliceCount": len(wanted)}
        client.ResourceV1Api(api).create_resource_slice(
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": s.name}, "spec": {**s.spec, "pool": pool}}
        )  # fmt: skip


def _claims(api: Any, namespace: str) -> list[dict[str, Any]]:
    from kubernetes import client

    raw = client.ResourceV1Api(api).list_namespaced_resource_claim(
        namespace, _preload_content=False
    )
    return [c for c in json.loads(raw.data)["items"] if (c.get("status") or {}).get("allocation")]


def test_templates_on_an_h200_node_allocated_then_prepared(
    api_client: Any, namespace: str, short_tmp: Path, fake_mps_control: str
) -> None:
    from kubernetes import client

    from tests.support.k8s import make_node

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = f"n-{uuid.uuid4().hex[:8]}"
    state = short_tmp / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200x4"), state))
    make_node(api_client, node)
    _publish(api_client, node, session)
    _device_classes(api_client)
    for name in ("one-1g-slice", "whole-gpu", "mps-25"):
        res.create_namespaced_resource_claim_template(namespace, _template(name, namespace))
    wanted = {"asr-0": "one-1g-slice", "asr-1": "one-1g-slice", "llm": "whole-gpu", "tts": "mps-25"}
    for pod, template in wanted.items():
        core.create_namespaced_pod(
            namespace, _pod(pod, node, {"resourceClaimTemplateName": template})
        )
    claims = _wait(
        "4 claims allocated", lambda: (c := _claims(api_client, namespace)) and len(c) == 4 and c
    )
    # The scheduler takes the pods in an order of its own: whichever comes first takes GPU 0.
    by_pod = {}
    for c in claims:
        (result,) = c["status"]["allocation"]["devices"]["results"]
        by_pod[c["metadata"]["name"].rsplit("-", 2)[0]] = result["device"]
    slices = sorted(d for p, d in by_pod.items() if p.startswith("asr"))
    wholes = sorted(d for p, d in by_pod.items() if not p.startswith("asr"))
    assert len(slices) == 2 and all("-mig-1g18gb-19-" in d for d in slices), by_pod
    slice_gpu = {d.split("-mig-")[0] for d in slices}
    assert len(slice_gpu) == 1, by_pod  # both on one GPU: first fit packs
    assert len(set(wholes)) == 2 and not slice_gpu & set(wholes), by_pod  # nothing overlaps

    config = NodeConfig(
        DRIVER, node, short_tmp / "p", short_tmp / "cdi", mps_control=fake_mps_control
    )
    driver = dra_driver(
        session, Settings(), config, lambda i: None, state.with_name(".sim.json.lock")
    )
    try:
        for c in claims:
            meta = c["metadata"]
            prepared = driver.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), c)
            assert [p.device for p in prepared] == [
                r["device"] for r in c["status"]["allocation"]["devices"]["results"]
            ]
        inventory = read_inventory(session)
        (gpu_index,) = {int(d.split("-")[1]) for d in slices}
        made = inventory.gpus[gpu_index]
        starts = sorted(int(d.rsplit("-", 1)[1]) for d in slices)
        assert sorted(s.placement.start for s in made.slices) == starts
        for d in wholes:
            assert not inventory.gpus[int(d.split("-")[1])].mig_current
        (share,) = [c for c in claims if c["status"]["allocation"]["devices"].get("config")]
        (shared,) = [r["device"] for r in share["status"]["allocation"]["devices"]["results"]]
        assert (driver.mps_root(share["metadata"]["uid"], shared) / "pipe").is_dir()
        for c in claims:
            driver.unprepare(c["metadata"]["uid"])
        assert all(g.slices == () for g in read_inventory(session).gpus)
    finally:
        for d in (short_tmp / "p" / "mps").glob("*/*"):
            from tests.support.dra import quit_mps

            quit_mps(fake_mps_control, d)
        session.close()


def test_the_1g_template_on_an_a100_node_takes_its_one_slice_profile(
    api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    from tests.support.k8s import make_node

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = f"n-{uuid.uuid4().hex[:8]}"
    lib = SimulatedNvml(parse_spec("a100-80gb"))
    session = NvmlSession(lib)
    MigWriter(session).set_mig_mode(0, True)  # an Ampere GPU offers slices while MIG is on,
    lib.reset(0)  # which takes a GPU reset there
    make_node(api_client, node)
    _publish(api_client, node, session)
    _device_classes(api_client)
    res.create_namespaced_resource_claim_template(namespace, _template("one-1g-slice", namespace))
    for i in range(8):
        core.create_namespaced_pod(
            namespace, _pod(f"asr-{i}", node, {"resourceClaimTemplateName": "one-1g-slice"})
        )
    claims = _wait(
        "7 claims allocated", lambda: (c := _claims(api_client, namespace)) and len(c) >= 7 and c
    )
    profiles = {
        r["device"].split("-mig-")[1].rsplit("-", 2)[0]
        for c in claims
        for r in c["status"]["allocation"]["devices"]["results"]
    }
    assert profiles == {"1g10gb"} and len(claims) == 7
