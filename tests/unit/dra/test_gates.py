"""DRAPartitionableDevices off: what is published (nodeagent.dra.nocounters) and when the
agent says so (nodeagent.dra.k8s.slices.GateWatch): once per change, a probe the API server
cannot answer keeps the last verdict."""

from __future__ import annotations

from nodeagent.base.errors import KubeError
from nodeagent.dra.k8s.slices import PROBE_INTERVAL_SECONDS, GateWatch
from nodeagent.dra.nocounters import safe_slices
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec


def test_only_devices_that_cannot_overlap() -> None:
    session = NvmlSession(SimulatedNvml(parse_spec("h200x3")))
    writer = MigWriter(session)
    for gpu in (1, 2):
        writer.set_mig_mode(gpu, True)
    gi = writer.create_gpu_instance(1, 19, Placement(3, 1))
    writer.create_compute_instance(1, gi, 1, 0, full=True)
    gi = writer.create_gpu_instance(1, 14, Placement(0, 2))
    writer.create_compute_instance(1, gi, 2, 0, full=True)
    specs = safe_slices(read_inventory(session), "n", "gpu.nodeagent.io")
    devices = {s.name: [d["name"] for d in s.spec["devices"]] for s in specs}
    assert devices == {
        "n-gpu-nodeagent-io-gpu-0": ["gpu-0"],  # MIG off: the whole GPU
        "n-gpu-nodeagent-io-gpu-1": ["gpu-1-mig-2g35gb-14-0", "gpu-1-mig-1g18gb-19-3"],
        "n-gpu-nodeagent-io-gpu-2": [],  # MIG on, no slice: nothing to hand out
    }
    assert not any("consumesCounters" in d for s in specs for d in s.spec["devices"])
    assert not any("sharedCounters" in s.spec for s in specs)


class FakeApi:
    def __init__(self) -> None:
        self.kept: bool | Exception = True
        self.events: list[tuple[str, str]] = []

    def counters_kept(self, driver: str) -> bool:
        if isinstance(self.kept, Exception):
            raise self.kept
        return self.kept

    def event(self, reason: str, message: str, kind: str = "Normal") -> None:
        self.events.append((reason, kind))


class Publisher:
    counters_dropped: bool | None = None


def test_the_gate_is_said_once_per_change() -> None:
    now = [0.0]
    api, publisher = FakeApi(), Publisher()
    gate = GateWatch(api, "gpu.nodeagent.io", publisher, lambda: now[0])  # type: ignore[arg-type]
    assert gate.counters_dropped() is False and api.events == []  # kept: nothing to say
    api.kept = False
    assert gate.counters_dropped() is False  # not probed again before the interval
    now[0] += PROBE_INTERVAL_SECONDS
    assert gate.counters_dropped() is True
    assert api.events == [("DRAPartitionableDevicesOff", "Warning")]
    now[0] += PROBE_INTERVAL_SECONDS
    api.kept = KubeError("the API server is down")
    assert gate.counters_dropped() is True  # the last verdict holds
    now[0] += PROBE_INTERVAL_SECONDS
    api.kept = True
    assert gate.counters_dropped() is False
    assert api.events[-1] == ("DRAPartitionableDevicesOn", "Normal")
    assert len(api.events) == 2
