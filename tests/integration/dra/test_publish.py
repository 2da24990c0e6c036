"""This node's ResourceSlices on a kmock API server: written once, rewritten (next pool
generation, every slice) only when the devices change, stale slices deleted last."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.base.shapes import Unreadable
from nodeagent.dra.devices import resource_slices
from nodeagent.dra.k8s.api import DraApi, read_slice
from nodeagent.dra.k8s.slices import SlicePublisher
from nodeagent.kube.api import KubeSettings, make_api_client
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.cli import captured_logs
from tests.support.cluster import Cluster, is_write
from tests.support.dra import DRIVER, NODE, dra_cluster

kmock = pytest.importorskip("kmock")
SLICES = kmock.resource("resource.k8s.io/v1/resourceslices")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = dra_cluster()
    yield c
    c.close()


def api(cluster: Cluster) -> DraApi:
    kube = KubeSettings(node_name=NODE, host=cluster.url, retry_seconds=1.0)
    return DraApi(make_api_client(kube), kube)


def inventory(spec: str, mig: dict[int, bool] | None = None) -> Inventory:
    session = NvmlSession(SimulatedNvml(parse_spec(spec)))
    inv = read_inventory(session)
    session.close()
    gpus = tuple(replace(g, mig_current=(mig or {}).get(g.index, False)) for g in inv.gpus)
    return replace(inv, gpus=gpus)


def slices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {
        name: dict(obj)
        for (res, _, name), obj in list(cluster.km.objects.items())
        if res == SLICES and not obj.deleted
    }


def writes(cluster: Cluster) -> int:
    return sum(1 for r in list(cluster.km) if is_write(r) and "resourceslices" in str(r.url))


def requests(cluster: Cluster) -> int:
    return sum(1 for r in list(cluster.km) if "resourceslices" in str(r.url))


def publish(cluster: Cluster, inv: Inventory, publisher: SlicePublisher | None = None) -> bool:
    publisher = publisher or SlicePublisher(api(cluster), DRIVER)
    return publisher.publish(resource_slices(inv, NODE, DRIVER))


def test_written_once_and_never_again_while_nothing_changes(cluster: Cluster) -> None:
    publisher = SlicePublisher(api(cluster), DRIVER)
    assert publish(cluster, inventory("h200x2"), publisher)
    found = slices(cluster)
    prefix = f"{NODE}-gpu-nodeagent-io-"
    assert sorted(found) == [prefix + "counters-0", prefix + "gpu-0", prefix + "gpu-1"]
    for obj in found.values():
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert obj["spec"]["driver"] == DRIVER and obj["spec"]["nodeName"] == NODE
    assert len(found[prefix + "gpu-0"]["spec"]["devices"]) == 26
    assert writes(cluster) == 3

    before = requests(cluster)
    assert not publish(cluster, inventory("h200x2"), publisher)
    assert requests(cluster) == before  # not even a read
    # A restarted agent reads the slices once and finds them as wanted.
    assert not publish(cluster, inventory("h200x2"))
    assert writes(cluster) == 3


def test_a_change_rewrites_the_pool_with_the_next_generation(cluster: Cluster) -> None:
    prefix = f"{NODE}-gpu-nodeagent-io-"
    assert publish(cluster, inventory("a100-40gbx2"))  # Ampere, MIG off: whole GPUs only
    assert sorted(slices(cluster)) == [prefix + "gpu-0", prefix + "gpu-1"]

    assert publish(cluster, inventory("a100-40gbx2", {0: True}))  # MIG on GPU 0: its slices
    found = slices(cluster)
    assert sorted(found) == [prefix + "counters-0", prefix + "gpu-0", prefix + "gpu-1"]
    assert {o["spec"]["pool"]["generation"] for o in found.values()} == {2}
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in found.values()} == {3}
    names = [d["name"] for d in found[prefix + "gpu-0"]["spec"]["devices"]]
    assert "gpu-0" not in names and "gpu-0-mig-7g40gb-0-0" in names

    assert publish(cluster, inventory("a100-40gbx2"))  # and back: the counters slice goes
    found = slices(cluster)
    assert sorted(found) == [prefix + "gpu-0", prefix + "gpu-1"]
    assert {o["spec"]["pool"]["generation"] for o in found.values()} == {3}


def test_only_this_drivers_slices_on_this_node_are_touched(cluster: Cluster) -> None:
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu.nvidia.com-x"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": {"name": NODE}},
    }
    cluster.km.objects[SLICES, None, "node-1-gpu.nvidia.com-x"] = other
    publisher = SlicePublisher(api(cluster), DRIVER)
    assert publisher.publish(resource_slices(inventory("h200"), NODE, DRIVER, gpus={0}))
    assert publisher.publish([])  # none wanted: this driver's go, the other's stay
    assert list(slices(cluster)) == ["node-1-gpu.nvidia.com-x"]


def _list_with(cluster: Cluster, *extra: Any) -> None:
    """The API server answers every list of the slices with `extra` before the slices it
    holds (a buggy server, a proxy, or an emulator)."""

    def answer() -> dict[str, Any]:
        held = [o.raw for (res, _, _), o in list(cluster.km.objects.items())
                if res == SLICES and not o.deleted]  # fmt: skip
        return {"metadata": {"resourceVersion": "1"}, "items": [*extra, *held]}

    cluster.on_loop(lambda: cluster.km["list", SLICES] << answer)


def test_slices_that_cannot_be_read_are_skipped_and_said_once(cluster: Cluster) -> None:
    """Items that are not objects failed every publish with Python's words ('str' object has
    no attribute 'get') and a traceback in the log; now each list is read through the shapes
    every other list is read through."""
    foreign = {"metadata": {"name": "node-1-x"}, "spec": "a string"}
    old = {"metadata": {"name": "node-1-y"}, "spec": {"driver": DRIVER, "nodeName": NODE,
                                                      "pool": {"generation": "7"}}}  # fmt: skip
    _list_with(cluster, "garbage", 5, foreign, old)
    with captured_logs("warning") as logs:
        assert publish(cluster, inventory("h200x2"))
        assert len(slices(cluster)) == 3
        assert not publish(cluster, inventory("h200x2"))  # a restart: found as wanted
    skipped = sorted(e["error"] for e in logs if e["event"] == "kube.object_skipped")
    assert skipped == [
        "a resourceslices object is not a JSON object",
        "resourceslice node-1-x: spec is a string, not an object",
        "resourceslice node-1-y: spec.pool.generation is a string, not a whole number",
    ], skipped  # the two items that are not objects share a key: said once
    with pytest.raises(Unreadable, match=r"^a ResourceSlice has no metadata\.name$"):
        read_slice({"spec": {}})


def test_a_write_answer_that_cannot_be_read_fails_the_publish_in_words(cluster: Cluster) -> None:
    bad = {"metadata": {"name": f"{NODE}-gpu-nodeagent-io-counters-0"}, "spec": {"devices": "x"}}
    cluster.on_loop(lambda: cluster.km["post", SLICES] << bad)
    publisher = SlicePublisher(api(cluster), DRIVER)
    with pytest.raises(KubeError) as err:
        publisher.publish(resource_slices(inventory("h200"), NODE, DRIVER, gpus={0}))
    assert str(err.value) == (
        f"Kubernetes API: create resourceslice {NODE}-gpu-nodeagent-io-counters-0: the answer cannot"
        f" be read: resourceslice {NODE}-gpu-nodeagent-io-counters-0: spec.devices is a string, not"
        " a list"
    )
