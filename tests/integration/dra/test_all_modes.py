"""One node serving every mode at once, changed live (issue 31 item 7): GPU 0 in MIG slices,
one a claim's and one shared by MPS (a consumable-capacity share of the slice), GPU 1 an MPS
share, GPU 2 a whole GPU, all in the node's ResourceSlices; GPU 0's free memory slices
repartitioned ten times by other claims moves no claim: the busy slices keep their MIG devices,
the MPS daemons keep serving, the whole GPU stays whole, and the published ResourceSlices are
not written again."""

from __future__ import annotations

import itertools

import pytest

from nodeagent.dra.devices import resource_slices
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.slices import SlicePublisher
from nodeagent.dra.traces import claim_holders
from nodeagent.kube.api import KubeSettings, make_api_client
from tests.support.cluster import is_write
from tests.support.dra import DRIVER, NODE, DraNode, allocated_claim, mps_config

kmock = pytest.importorskip("kmock")
SLICES = kmock.resource("resource.k8s.io/v1/resourceslices")
# GPU 0's free half (memory slices 4-7) in five layouts: each a claim of its own
FREE_HALF = (
    "gpu-0-mig-1g18gb-19-6",
    "gpu-0-mig-2g35gb-14-4",
    "gpu-0-mig-3g71gb-9-4",
    "gpu-0-mig-1g35gb-15-4",
    "gpu-0-mig-1g18gb-19-5",
)


@pytest.mark.parametrize("dra_node", ["h200x4"], indirect=True)
def test_every_mode_at_once_and_ten_repartitions_move_no_claim(dra_node: DraNode) -> None:
    kubelet = dra_node.kubelet
    busy = dra_node.add_claim(allocated_claim("asr", "uid-busy", {"gpu": "gpu-0-mig-2g35gb-14-0"}))
    inside = allocated_claim("emb", "uid-in", {"gpu": "gpu-0-mig-1g18gb-19-2-mps"})
    (result,) = inside["status"]["allocation"]["devices"]["results"]
    result["shareID"] = "1f0c2d36-0b55-4a4e-9a57-6c1e2d7f0a11"
    result["consumedCapacity"] = {"gpu.nodeagent.io/sm": "50", "gpu.nodeagent.io/memory": "8Gi"}
    shared_slice = dra_node.add_claim(inside)
    share = dra_node.add_claim(
        allocated_claim("tts", "uid-mps", {"gpu": "gpu-1"}, mps_config(25, "16Gi"))
    )
    whole = dra_node.add_claim(allocated_claim("llm", "uid-whole", {"gpu": "gpu-2"}))
    results = kubelet.prepare([busy, shared_slice, share, whole])
    assert {uid: r.error for uid, r in results.items()} == {
        "uid-busy": "", "uid-in": "", "uid-mps": "", "uid-whole": ""
    }  # fmt: skip

    inventory = dra_node.inventory()
    kept = sorted((s.placement.start, s.profile, s.mig_uuid) for s in inventory.gpus[0].slices)
    assert [(start, profile) for start, profile, _ in kept] == [(0, "2g.35gb"), (2, "1g.18gb")]
    busy_slice = next(s for s in inventory.gpus[0].slices if s.placement.start == 0)
    pipe = dra_node.root / "p" / "mps" / "uid-mps" / "gpu-1" / "pipe"
    # the slice's share server (one for all the share claims on it: nodeagent.mps.servers)
    pipe_in = dra_node.root / "p" / "mps-shared" / "gpu-0-mig-1g18gb-19-2-mps-u0" / "pipe"
    assert (pipe / "control").exists() and (pipe_in / "control").exists()
    assert not inventory.gpus[1].mig_current and not inventory.gpus[2].mig_current

    # All of it published together, once.
    kube = KubeSettings(node_name=NODE, host=dra_node.cluster.url, retry_seconds=1.0)
    publisher = SlicePublisher(DraApi(make_api_client(kube), kube), DRIVER)
    assert publisher.publish(resource_slices(inventory, NODE, DRIVER, shares="mig"))
    names = {
        d["name"]
        for (resource, _, _), obj in list(dra_node.cluster.km.objects.items())
        if resource == SLICES and not obj.deleted
        for d in dict(obj)["spec"].get("devices", [])
    }
    assert {
        "gpu-0-mig-2g35gb-14-0", "gpu-0-mig-1g18gb-19-2-mps", "gpu-1", "gpu-1-mps", "gpu-2",
        *FREE_HALF,
    } <= names  # fmt: skip
    slice_writes = sum(
        1 for r in list(dra_node.cluster.km) if is_write(r) and "resourceslices" in str(r.url)
    )

    for n, device in zip(range(10), itertools.cycle(FREE_HALF), strict=False):
        claim = dra_node.add_claim(allocated_claim("batch", f"uid-r{n}", {"gpu": device}))
        assert kubelet.prepare([claim])[f"uid-r{n}"].error == "", device
        start = int(device.rsplit("-", 1)[1])
        made = [s for s in dra_node.inventory().gpus[0].slices if s.placement.start == start]
        assert made, device
        assert kubelet.unprepare([claim]) == {f"uid-r{n}": ""}

        now = dra_node.inventory()
        # the busy slices: the same MIG devices at the same places, still the claims'
        assert (
            sorted((s.placement.start, s.profile, s.mig_uuid) for s in now.gpus[0].slices) == kept
        )
        assert claim_holders(dra_node.checkpoint)[str(busy_slice.mig_uuid)].pod == "asr"
        # both MPS shares still served, the whole GPU still whole and held
        assert (pipe / "control").exists() and (pipe_in / "control").exists()
        assert not now.gpus[1].mig_current and not now.gpus[2].mig_current
        held = claim_holders(dra_node.checkpoint)
        assert held[now.gpus[1].uuid].pod == "tts" and held[now.gpus[2].uuid].pod == "llm"
        # the devices did not change: nothing to publish
        assert not publisher.publish(resource_slices(now, NODE, DRIVER, shares="mig"))

    writes_after = sum(
        1 for r in list(dra_node.cluster.km) if is_write(r) and "resourceslices" in str(r.url)
    )
    assert writes_after == slice_writes
    assert kubelet.unprepare([busy, shared_slice, share, whole]) == {
        "uid-busy": "", "uid-in": "", "uid-mps": "", "uid-whole": ""
    }  # fmt: skip
