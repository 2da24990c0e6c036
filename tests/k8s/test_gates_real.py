"""The DRA driver against the real API server (v1.36.2): with DRAPartitionableDevices off it
sees the counters dropped (a dry-run probe), publishes only devices that cannot overlap, says
so once (log, Node Event, metric), and a restart writes nothing; with the gate on, a restart
with unchanged devices writes nothing either."""

from __future__ import annotations

import os
import uuid
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
from tests.support import leaks
from tests.support.k8s import (
    DEFAULT_GATES,
    ControlPlane,
    k8s_available,
    make_node,
    required,
    shared_control_plane,
)

DRIVER = "gpu.nodeagent.io"


@pytest.fixture(scope="module")
def gate_off() -> ControlPlane:
    """A control plane of the session's own, DRAPartitionableDevices off (shared by the xdist
    workers that run this module's tests; stopped at the session's end)."""
    if not k8s_available():
        if required():
            pytest.fail("../shared/k8s is not beside this checkout (CI needs it)")
        pytest.skip("../shared/k8s is not beside this checkout: no real control plane")
    gates = DEFAULT_GATES.replace("DRAPartitionableDevices=true", "DRAPartitionableDevices=false")
    try:
        return shared_control_plane(os.environ[leaks.MARKER], gates, 50, "gate-off")
    except RuntimeError as err:
        pytest.fail(str(err))


def _plugin(
    root: Path, cp: ControlPlane, node: str, gpus: str = "h200x2"
) -> tuple[DraDriver, NvmlSession]:
    session = NvmlSession(SimulatedNvml(parse_spec(gpus), root / "sim.json"))
    base = Settings()
    dra = replace(
        base.dra,
        enabled=True,
        plugin_dir=root / "p",
        registry_dir=root / "reg",
        cdi_dir=root / "cdi",
    )
    settings = replace(base, dra=dra)
    config = NodeConfig(DRIVER, node, root / "p", root / "cdi")
    driver = dra_driver(session, settings, config, lambda i: None, root / ".sim.json.lock")
    kube = KubeSettings(node_name=node, kubeconfig=str(cp.kubeconfig), retry_seconds=5)
    return DraDriver(session, settings, kube, driver.engine, driver.owners), session


def _stored(plugin: DraDriver) -> dict[str, Any]:
    return {s["metadata"]["name"]: s["spec"] for s in plugin.api.list_slices(DRIVER)}


def _events(api_client: Any, reason: str) -> list[Any]:
    from kubernetes import client

    events = client.CoreV1Api(api_client).list_namespaced_event("default").items
    return [e for e in events if e.reason == reason]


def _api(cp: ControlPlane) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(str(cp.kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def test_counters_dropped_only_devices_that_cannot_overlap(
    gate_off: ControlPlane, tmp_path: Path
) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    api = _api(gate_off)
    make_node(api, node)
    plugin, session = _plugin(tmp_path, gate_off, node, "h200x3")
    writer = MigWriter(session)
    writer.set_mig_mode(2, True)  # MIG on, no slice: an empty slice (stored without `devices`)
    writer.set_mig_mode(1, True)
    gi = writer.create_gpu_instance(1, 9, Placement(4, 4))
    writer.create_compute_instance(1, gi, 3, 0, full=True)

    assert plugin.publish(read_inventory(session)) is True

    assert plugin.publisher.counters_dropped is True
    stored = _stored(plugin)
    devices = {
        name: [d["name"] for d in spec.get("devices") or []] for name, spec in stored.items()
    }
    assert devices == {
        f"{node}-gpu-nodeagent-io-gpu-0": ["gpu-0"],
        f"{node}-gpu-nodeagent-io-gpu-1": ["gpu-1-mig-3g71gb-9-4"],
        f"{node}-gpu-nodeagent-io-gpu-2": [],
    }
    assert not any("sharedCounters" in spec for spec in stored.values())
    assert len(_events(api, "DRAPartitionableDevicesOff")) == 1
    generation = plugin.publisher.generation
    # Again, and after a restart: nothing written, the same generation, no second event.
    writes = plugin.publisher.writes
    assert plugin.publish(read_inventory(session)) is False
    again, session2 = _plugin(tmp_path, gate_off, node, "h200x3")
    assert again.publish(read_inventory(session2)) is False
    assert again.publisher.writes == 0 and again.publisher.generation == generation
    assert plugin.publisher.writes == writes
    # a new agent says it once again (its own start), never per publish
    assert len(_events(api, "DRAPartitionableDevicesOff")) == 2
    session.close()
    session2.close()


def test_a_restart_with_the_gate_on_writes_nothing(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(_api(control_plane), node)
    plugin, session = _plugin(tmp_path, control_plane, node)
    assert plugin.publish(read_inventory(session)) is True
    assert plugin.publisher.counters_dropped is False
    stored = _stored(plugin)
    assert any(spec.get("sharedCounters") for spec in stored.values())
    generation = plugin.publisher.generation
    again, session2 = _plugin(tmp_path, control_plane, node)
    assert again.publish(read_inventory(session2)) is False
    assert again.publisher.writes == 0 and again.publisher.generation == generation
    session.close()
    session2.close()


def test_a_write_answer_without_counters_stops_before_any_device(
    gate_off: ControlPlane, tmp_path: Path
) -> None:
    """The read-back of each write, without the probe (one that failed): the counters slice
    goes first, comes back without its counters, and nothing more is written."""
    from nodeagent.dra.devices import resource_slices
    from nodeagent.dra.k8s.slices import SlicePublisher

    node = f"n-{uuid.uuid4().hex[:8]}"
    make_node(_api(gate_off), node)
    plugin, session = _plugin(tmp_path, gate_off, node)
    publisher = SlicePublisher(plugin.api, DRIVER)
    assert publisher.publish(resource_slices(read_inventory(session), node, DRIVER))
    assert publisher.counters_dropped is True and publisher.writes == 1
    stored = _stored(plugin)
    assert list(stored) == [f"{node}-gpu-nodeagent-io-counters-0"]
    assert not stored[f"{node}-gpu-nodeagent-io-counters-0"].get("devices")
    session.close()
