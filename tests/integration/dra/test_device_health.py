"""Health and taints through the whole agent (`nodeagent run --kube --dra` on the emulator, a
kmock API server, the fake kubelet): an XID injected on a GPU or on one MIG slice taints exactly
those devices in the next ResourceSlice write, reaches the kubelet's health stream as
Unhealthy, and both clear by themselves once dra.health-hold passes without a new one, unless
the XID asks for a GPU reset or a node reboot: then they wait for it; the other devices'
entries are never touched."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.integration.dra.test_publish import slices
from tests.support.agent import make_agent
from tests.support.cluster import Cluster, kube_group
from tests.support.dra import CLAIMS, DRIVER, NODE, allocated_claim, dra_cluster, dra_group
from tests.support.fake_kubelet.dra import Claim, DeviceHealth, FakeDraKubelet

HOLD_SECONDS = 1.5
KEY = "gpu.nodeagent.io/unhealthy"
PREFIX = f"{NODE}-gpu-nodeagent-io-"


@pytest.fixture
def agent(short_root: Path) -> Iterator[tuple[Agent, Cluster, SimulatedNvml]]:
    cluster = dra_cluster()
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    lib = SimulatedNvml(parse_spec("h200x2"))
    agent = make_agent(
        NvmlSession(lib),
        lib.reset,
        metrics={"refresh_interval_seconds": 0.2},
        reconcile={"interval_seconds": 300},
        kube=kube_group(cluster, NODE),
        dra=dra_group(
            short_root,
            health_interval_seconds=0.1,
            health_hold_seconds=HOLD_SECONDS,
            fatal_faults=("xid-48", "xid-94"),
        ),
    )
    agent.start()
    try:
        cluster.wait(lambda: len(slices(cluster)) == 3, what="the node's 3 ResourceSlices")
        yield agent, cluster, lib
    finally:
        agent.stop()
        cluster.close()


def devices(cluster: Cluster, gpu: int) -> dict[str, dict[str, Any]]:
    obj = slices(cluster).get(f"{PREFIX}gpu-{gpu}")
    return {d["name"]: d for d in ((obj or {}).get("spec") or {}).get("devices", [])}


def tainted(cluster: Cluster) -> dict[str, dict[str, str]]:
    """Every tainted device: its one taint, without the time."""
    out = {}
    for gpu in (0, 1):
        for name, d in devices(cluster, gpu).items():
            if d.get("taints"):
                (t,) = d["taints"]
                assert t["key"] == KEY and t["timeAdded"].endswith("Z")
                out[name] = {"value": t["value"], "effect": t["effect"]}
    return out


class HealthStream:
    """The fake kubelet's health stream, read in a thread; `wait(check)` returns the first
    message (devices by name) that `check` accepts."""

    def __init__(self, kubelet: FakeDraKubelet, version: str | None = None) -> None:
        self.messages: queue.Queue[dict[str, DeviceHealth]] = queue.Queue()
        self._stream = kubelet.watch_health(timeout_seconds=60, health=version)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for message in self._stream:
            self.messages.put(message)

    def wait(self, check: Any, seconds: float = 20) -> dict[str, DeviceHealth]:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self.messages.get(timeout=left)
            except queue.Empty:
                break
            if check(message):
                return message
        raise AssertionError("the health stream never said so")


def test_an_xid_on_a_gpu_taints_it_and_its_slices_and_clears_by_itself(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    _, cluster, lib = agent
    # GPU 1's entries once published (under load the agent may not have written them yet)
    cluster.wait(lambda: len(devices(cluster, 1)) == 26, what="gpu-1 published", timeout=10)
    untouched = devices(cluster, 1)
    kubelet = FakeDraKubelet(short_root / "reg")
    kubelet.register(DRIVER)
    assert kubelet.health_version() == "v1.DRAResourceHealth"
    stream = HealthStream(kubelet)
    first = stream.wait(lambda m: len(m) == 52)
    assert {h.health for h in first.values()} == {"HEALTHY"}
    assert {h.pool for h in first.values()} == {NODE}

    started = time.monotonic()
    lib.inject_xid(0, 32)  # a PBDMA error: restart the application
    cluster.wait(lambda: "gpu-0" in tainted(cluster), what="gpu-0 tainted", timeout=10)
    elapsed = time.monotonic() - started
    found = tainted(cluster)
    assert sorted(found) == sorted(devices(cluster, 0)) and len(found) == 26
    assert set(map(str, found.values())) == {str({"value": "xid-32", "effect": "NoSchedule"})}
    assert devices(cluster, 1) == untouched  # the other GPU's entries, exactly as they were
    print(f"XID to taint in the ResourceSlice: {elapsed:.2f} s")  # measured, not asserted

    sick = stream.wait(lambda m: m["gpu-0"].health == "UNHEALTHY")
    assert sick["gpu-0"].message == "xid-32"
    assert {n for n, h in sick.items() if h.health == "UNHEALTHY"} == set(found)

    # No new XID for dra.health-hold: healthy again, in the slices and in the stream.
    cluster.wait(lambda: not tainted(cluster), what="the taints gone", timeout=10)
    assert devices(cluster, 1) == untouched
    well = stream.wait(lambda m: m["gpu-0"].health == "HEALTHY")
    assert {h.health for h in well.values()} == {"HEALTHY"}


def test_an_xid_of_one_mig_slice_taints_that_slice_only_and_fatal_is_no_execute(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    running, cluster, lib = agent
    kubelet = FakeDraKubelet(short_root / "reg")
    kubelet.register(DRIVER)
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-1-mig-1g18gb-19-6"})
    cluster.km.objects[CLAIMS, "speech", "asr"] = claim
    assert kubelet.prepare([Claim("speech", "asr", "uid-1")])["uid-1"].error == ""
    with running.session.lock:
        (made,) = read_inventory(running.session).gpus[1].slices
    cluster.wait(  # the agent's snapshot knows the slice: its XIDs are the slice's
        lambda: any(s.gi_id == made.gi_id for s in running.store.snapshot.inventory.gpus[1].slices),
        what="the slice in the agent's snapshot",
    )
    cluster.wait(  # published as made: no binding condition left on it
        lambda: "bindingConditions" not in devices(cluster, 1)["gpu-1-mig-1g18gb-19-6"],
        what="the slice published as made",
    )
    before = {**devices(cluster, 0), **devices(cluster, 1)}

    lib.inject_xid(1, 94, gi=made.gi_id)  # a contained ECC error: fatal by the settings
    cluster.wait(lambda: tainted(cluster), what="a taint", timeout=10)
    assert tainted(cluster) == {"gpu-1-mig-1g18gb-19-6": {"value": "xid-94", "effect": "NoExecute"}}
    after = {**devices(cluster, 0), **devices(cluster, 1)}
    assert {n for n in before if after[n] != before[n]} == {"gpu-1-mig-1g18gb-19-6"}
    with pytest.raises(Exception, match="no GPU instance 9"):
        lib.inject_xid(1, 48, gi=9)
    cluster.wait(lambda: not tainted(cluster), what="the taint gone", timeout=10)
    assert {**devices(cluster, 0), **devices(cluster, 1)} == before


def stays(check: Any, seconds: float) -> bool:
    """Whether `check` holds throughout `seconds` (read every poll of the agent's)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return False
        time.sleep(0.05)
    return True


def test_a_reset_class_xid_waits_for_the_gpu_reset_where_the_driver_reports_no_action(
    agent: tuple[Agent, Cluster, SimulatedNvml],
) -> None:
    """A driver without the recovery-action field: NVIDIA's Xid catalog says 48 needs a reset;
    the reset is seen as the pending row remap done."""
    _, cluster, lib = agent
    lib.set_health(1, recovery_action="unsupported", row_remap_pending=1)
    cluster.wait(lambda: "gpu-1" in tainted(cluster), what="the pending remap", timeout=10)
    lib.inject_xid(1, 48)
    want = {"value": "row-remap-pending.xid-48", "effect": "NoExecute"}
    cluster.wait(lambda: tainted(cluster).get("gpu-1") == want, what="xid-48", timeout=10)
    assert stays(lambda: tainted(cluster).get("gpu-1") == want, 2 * HOLD_SECONDS)
    lib.reset(1)
    cluster.wait(lambda: not tainted(cluster), what="the taints gone", timeout=10)


def test_the_drivers_recovery_action_keeps_the_taint_until_it_is_done(
    agent: tuple[Agent, Cluster, SimulatedNvml],
) -> None:
    _, cluster, lib = agent
    lib.inject_xid(0, 119, recovery_action="gpu-reset")  # a GSP RPC timeout
    lib.inject_xid(1, 79, recovery_action="node-reboot")  # fallen off the bus
    want = {
        "gpu-0": {"value": "recovery-gpu-reset.xid-119", "effect": "NoSchedule"},
        "gpu-1": {"value": "recovery-node-reboot.xid-79", "effect": "NoSchedule"},
    }

    def gpus() -> dict[str, dict[str, str]]:
        return {n: v for n, v in tainted(cluster).items() if n in want}

    cluster.wait(lambda: gpus() == want, what="both GPUs tainted", timeout=10)
    assert stays(lambda: gpus() == want, 2 * HOLD_SECONDS)
    lib.reset(0)
    lib.reset(1)  # a GPU reset does not do what a reboot does
    cluster.wait(lambda: gpus() == {"gpu-1": want["gpu-1"]}, what="gpu-0 healthy", timeout=10)
    assert stays(lambda: "gpu-1" in gpus(), HOLD_SECONDS)
    lib.reboot()
    cluster.wait(lambda: not tainted(cluster), what="the taints gone", timeout=10)


def test_application_xids_taint_nothing(
    agent: tuple[Agent, Cluster, SimulatedNvml],
) -> None:
    _, cluster, lib = agent
    lib.inject_xid(0, 13)
    lib.inject_xid(0, 31)
    lib.inject_xid(1, 79)  # read in the same poll as the two before it, or a later one
    cluster.wait(lambda: "gpu-1" in tainted(cluster), what="gpu-1 tainted", timeout=10)
    assert not any(name.startswith("gpu-0") for name in tainted(cluster))


@pytest.mark.parametrize(
    "version", ["v1alpha1.DRAResourceHealth", "v1beta1.DRAResourceHealth", "v1.DRAResourceHealth"]
)
def test_every_version_of_the_health_stream_is_served(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path, version: str
) -> None:
    """A 1.34 kubelet calls v1alpha1 whatever the registration says; newer ones pick one."""
    _, _, lib = agent
    kubelet = FakeDraKubelet(short_root / "reg")
    kubelet.register(DRIVER)
    stream = HealthStream(kubelet, version)
    lib.inject_xid(1, 79)
    sick = stream.wait(lambda m: m["gpu-1"].health == "UNHEALTHY")
    assert sick["gpu-0"].health == "HEALTHY" and sick["gpu-1"].last_updated > 0
    assert sick["gpu-1"].message == ("" if version.startswith("v1alpha1") else "xid-79")


def test_an_uncorrected_ecc_error_taints_the_gpu_until_the_counters_are_stable(
    agent: tuple[Agent, Cluster, SimulatedNvml],
) -> None:
    _, cluster, lib = agent
    lib.set_health(1, ecc_uncorrected=1)
    cluster.wait(lambda: "gpu-1" in tainted(cluster), what="gpu-1 tainted", timeout=10)
    assert tainted(cluster)["gpu-1"] == {"value": "ecc-uncorrected", "effect": "NoSchedule"}
    assert not any(name.startswith("gpu-0") for name in tainted(cluster))
    cluster.wait(lambda: not tainted(cluster), what="the taints gone", timeout=10)
