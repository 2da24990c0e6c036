"""The `DRAPartitionableDevices` feature gate off, on kmock made to store slices as
kube-apiserver v1.36 does (counters dropped from a slice that had none, empty lists omitted):
the DRA plugin publishes only devices that cannot overlap, says so once, and a restart writes
nothing; when the dry-run probe cannot tell, the first write's answer does, before any device
went out without its counters."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.dra.k8s.driver import DraDriver
from nodeagent.dra.node import NodeConfig
from nodeagent.kube.api import KubeSettings
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.cli import captured_logs
from tests.support.cluster import Cluster, is_write
from tests.support.dra import DRIVER, NODE

kmock = pytest.importorskip("kmock")
aiohttp_web = pytest.importorskip("aiohttp.web")
SLICES = kmock.resource("resource.k8s.io/v1/resourceslices")
PREFIX = f"{NODE}-gpu-nodeagent-io-"


def _has_counters(spec: dict[str, Any]) -> bool:
    devices = spec.get("devices") or []
    return bool(spec.get("sharedCounters")) or any(d.get("consumesCounters") for d in devices)


class Gate:
    """kube-apiserver's DRAPartitionableDevices (on or off) and how it answers dry runs."""

    def __init__(self) -> None:
        self.on = False
        self.dry_run_status = 201  # 403: dry runs forbidden
        self.dry_runs = 0


class GatedEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """kmock storing ResourceSlices as kube-apiserver v1.36.2 does (tried on shared/k8s): gate
    off, a slice that holds no counters loses those it is sent, silently (the strategy's
    dropDisabledDRAPartitionableDevicesFields); one that holds some keeps them; an empty
    `devices` list is not stored (omitempty). Dry runs store nothing."""

    gate = Gate()
    names = itertools.count()

    async def _handle(self, request: Any) -> Any:
        if request.resource == SLICES and isinstance(request.data, dict):
            spec = request.data.get("spec") or {}
            key = (SLICES, None, request.name)
            old = dict(self.objects[key]) if request.name and key in self.objects else None
            if not self.gate.on and not (old and _has_counters(old.get("spec") or {})):
                spec.pop("sharedCounters", None)
                for device in spec.get("devices") or []:
                    device.pop("consumesCounters", None)
            if spec.get("devices") == []:
                del spec["devices"]
            if request.params.get("dryRun"):
                return self._dry_run(request.data)
        return await super()._handle(request)

    def _dry_run(self, body: dict[str, Any]) -> Any:
        self.gate.dry_runs += 1
        status = self.gate.dry_run_status
        if status != 201:
            answer = {"kind": "Status", "code": status, "message": "dry run refused"}
            return aiohttp_web.json_response(answer, status=status)
        answer = copy.deepcopy(body)
        meta = answer["metadata"]
        meta["name"] = meta.get("name") or f"{meta.pop('generateName', '')}{next(self.names)}"
        return aiohttp_web.json_response(answer, status=201)


class GatedCluster(Cluster):
    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        super().__init__()

    async def _main(self) -> None:
        km = GatedEmulator()
        km.gate = self.gate
        km.resources["resource.k8s.io/v1/resourceslices"].kind = "ResourceSlice"
        km.resources["resource.k8s.io/v1/resourceslices"].namespaced = False
        async with km, kmock.Server(km) as server:
            self.km, self.url = km, str(server.url)
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def cluster(gate: Gate) -> Iterator[Cluster]:
    c = GatedCluster(gate)
    yield c
    c.close()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[NvmlSession]:
    """Two H200s: GPU 0 with MIG off, GPU 1 with MIG on and a 3g.71gb at 4; or `h200x3`'s
    third GPU with MIG on and no slice (see `empty_gpu`)."""
    s = NvmlSession(SimulatedNvml(parse_spec("h200x3"), tmp_path / "sim.json"))
    writer = MigWriter(s)
    writer.set_mig_mode(1, True)
    writer.set_mig_mode(2, True)
    gi = writer.create_gpu_instance(1, 9, Placement(4, 4))
    writer.create_compute_instance(1, gi, 3, 0, full=True)
    yield s
    s.close()


def plugin(root: Path, session: NvmlSession, cluster: Cluster) -> DraDriver:
    """The agent's DRA plugin as `run --kube --dra` makes it (a new one: a restarted agent)."""
    base = Settings()
    dra = replace(
        base.dra, enabled=True, plugin_dir=root / "p", registry_dir=root / "r", cdi_dir=root / "c"
    )
    settings = replace(base, dra=dra)
    config = NodeConfig(DRIVER, NODE, root / "p", root / "c")
    driver = dra_driver(session, settings, config, lambda i: None, root / ".sim.json.lock")
    kube = KubeSettings(node_name=NODE, host=cluster.url, retry_seconds=1.0)
    return DraDriver(session, settings, kube, driver.engine, driver.owners)


def stored(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {
        name: dict(obj)["spec"]
        for (res, _, name), obj in list(cluster.km.objects.items())
        if res == SLICES and not obj.deleted
    }


def devices(cluster: Cluster) -> dict[str, list[str]]:
    return {n: [d["name"] for d in s.get("devices") or []] for n, s in stored(cluster).items()}


def writes(cluster: Cluster) -> int:
    """Writes the server stored (a dry run is not one)."""
    return sum(
        1
        for r in list(cluster.km)
        if is_write(r) and r.resource == SLICES and not r.params.get("dryRun")
    )


def node_events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e.get("reason") == reason]


SAFE = {
    PREFIX + "gpu-0": ["gpu-0"],
    PREFIX + "gpu-1": ["gpu-1-mig-3g71gb-9-4"],
    PREFIX + "gpu-2": [],  # MIG on, no slice: nothing to hand out
}


def test_gate_off_only_devices_that_cannot_overlap_and_a_restart_writes_nothing(
    cluster: Cluster, gate: Gate, session: NvmlSession, tmp_path: Path
) -> None:
    first = plugin(tmp_path, session, cluster)
    with captured_logs("info") as logs:
        assert first.publish(read_inventory(session))
        assert not first.publish(read_inventory(session))
    assert devices(cluster) == SAFE
    assert not any(_has_counters(s) for s in stored(cluster).values())
    assert first.publisher.counters_dropped is True
    (warning,) = [e for e in logs if e["event"] == "dra.counters_dropped"]
    assert warning["gate"] == "DRAPartitionableDevices"
    (event,) = node_events(cluster, "DRAPartitionableDevicesOff")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == NODE
    before, generation = writes(cluster), first.publisher.generation

    # A restarted agent: the same slices (the empty GPU's slice too, stored without its empty
    # `devices`), so nothing is written and the generation stays.
    restarted = plugin(tmp_path, session, cluster)
    assert not restarted.publish(read_inventory(session))
    assert writes(cluster) == before and restarted.publisher.writes == 0
    assert restarted.publisher.generation == generation
    assert {s["pool"]["generation"] for s in stored(cluster).values()} == {generation}


def test_a_probe_that_cannot_tell_is_overruled_by_the_first_answer(
    cluster: Cluster, gate: Gate, session: NvmlSession, tmp_path: Path
) -> None:
    gate.dry_run_status = 403  # the probe fails: the plugin writes every device, as before
    p = plugin(tmp_path, session, cluster)
    with captured_logs("info") as logs:
        assert p.publish(read_inventory(session))
        # The counters slice went first and came back without its counters: nothing more was
        # written, so no device is out without them.
        assert devices(cluster) == {PREFIX + "counters-0": []}
        assert p.publisher.counters_dropped is True
        assert p.publish(read_inventory(session))  # the next publish: the safe devices
    assert devices(cluster) == SAFE
    assert len([e for e in logs if e["event"] == "dra.counters_dropped"]) == 1
    assert len(node_events(cluster, "DRAPartitionableDevicesOff")) == 1
    sent = [r.data for r in list(cluster.km) if is_write(r) and r.resource == SLICES and r.data]
    for body in sent:  # at no moment did the API hold a GPU beside one of its slices
        names = [d["name"] for d in body["spec"].get("devices") or []]
        assert not any(f"gpu-{i}" in names and f"gpu-{i}-mig" in " ".join(names) for i in range(3))


def test_gate_on_a_restart_writes_nothing(
    cluster: Cluster, gate: Gate, session: NvmlSession, tmp_path: Path
) -> None:
    gate.on = True
    first = plugin(tmp_path, session, cluster)
    assert first.publish(read_inventory(session))
    assert first.publisher.counters_dropped is False
    assert len(devices(cluster)[PREFIX + "gpu-2"]) == 26  # every placement, with counters
    before = writes(cluster)
    restarted = plugin(tmp_path, session, cluster)
    assert not restarted.publish(read_inventory(session))
    assert writes(cluster) == before and restarted.publisher.writes == 0
