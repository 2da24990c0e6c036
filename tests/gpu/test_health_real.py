"""Health reads on a real GPU (the lent H200): plausible values, energy growing under a CUDA
load, the XID event set registered. Read-only: no setting of the GPU is changed."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client import generate_latest

from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.health import XidWatcher, read_health
from nodeagent.nvml.session import gpu_handle
from tests.support.agent import make_agent

pytestmark = pytest.mark.gpu


def test_health_reads_are_plausible(session: NvmlSession) -> None:
    for gpu in read_inventory(session).gpus:
        h = read_health(session, gpu_handle(session, gpu.index))
        print(f"GPU {gpu.index} {gpu.name}: {h}")
        assert h.temperature_celsius is not None and 10 <= h.temperature_celsius <= 100
        assert h.power_watts is not None and h.power_limit_watts is not None
        assert 10 <= h.power_watts <= h.power_limit_watts * 1.2
        assert 100 <= h.power_limit_watts <= 1500
        assert h.energy_joules is not None and h.energy_joules > 0
        assert h.sm_clock_hertz is not None and 100e6 <= h.sm_clock_hertz <= 3.5e9
        assert h.memory_clock_hertz is not None and 500e6 <= h.memory_clock_hertz <= 20e9
        assert h.throttle is not None
        # Data-centre boards report ECC (aggregate at least) and PCIe replays.
        assert ("uncorrected", "aggregate") in h.ecc_errors
        assert h.pcie_replays is not None and h.pcie_replays >= 0
        if gpu.architecture in ("ampere", "hopper", "blackwell"):
            assert h.row_remap_pending is not None and h.row_remap_failure is not None


def test_mig_device_reads_do_not_fail(session: NvmlSession) -> None:
    """What NVML gives per MIG device (if MIG is on; never turned on here)."""
    from nodeagent.nvml.health import mig_handle

    slices = [s for g in read_inventory(session).gpus for s in g.slices if s.mig_uuid]
    if not slices:
        pytest.skip("no MIG device on this machine (MIG mode is not changed by this test)")
    for s in slices:
        handle = mig_handle(session, s.mig_uuid or "")
        print(f"GPU {s.gpu_index} GI {s.gi_id} CI {s.ci_id}: {read_health(session, handle)}")


def test_energy_and_power_rise_under_load(
    session: NvmlSession, load: subprocess.Popen[str]
) -> None:
    dev = gpu_handle(session, 0)
    first = read_health(session, dev)
    time.sleep(3.0)
    second = read_health(session, dev)
    print(f"under load: {first}\nthen: {second}")
    assert first.energy_joules is not None and second.energy_joules is not None
    assert second.energy_joules > first.energy_joules
    assert second.power_watts is not None and second.power_watts > 150
    assert second.sm_clock_hertz is not None and second.sm_clock_hertz > 1e9
    assert second.throttle is not None and not second.throttle["gpu_idle"]


def test_xid_event_set_registers_and_polls(session: NvmlSession) -> None:
    watcher = XidWatcher(session)
    try:
        watched = [i for i in range(len(read_inventory(session).gpus)) if watcher.watch(i)]
        print(f"XID events watched on GPUs {watched}")
        assert watched, "no GPU accepted an XID event registration"
        assert watcher.poll() == []  # nothing happened since registration (a healthy GPU)
    finally:
        watcher.close()


def test_exposition_excerpt(session: NvmlSession) -> None:
    """The health series of the agent's exposition on this machine (printed for the notes)."""
    agent = make_agent(session, lambda _i: None)
    agent.refresh()
    text = generate_latest(agent.registry).decode()
    agent.health.close()
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith("#")
        and any(
            key in line
            for key in ("temperature", "power", "energy", "clock", "xid", "ecc", "remap", "pcie")
        )
    ]
    print("\n".join(lines))
    assert any(line.startswith("nodeagent_gpu_temperature_celsius{") for line in lines)
    assert any(line.startswith("nodeagent_gpu_energy_joules_total{") for line in lines)


def test_the_unsupported_reads_kept_per_device_change_no_value(session: NvmlSession) -> None:
    """What a device answered 'not supported' is not asked again (the health sampler keeps it
    per device): a read with that memory has the same supported fields as a fresh read."""
    for gpu in read_inventory(session).gpus:
        dev = gpu_handle(session, gpu.index)
        unsupported: set[tuple[object, ...]] = set()
        first = read_health(session, dev, unsupported)
        again = read_health(session, dev, unsupported)
        fresh = read_health(session, dev)
        print(f"GPU {gpu.index}: not supported {sorted(map(str, unsupported))}")
        for h in (again, fresh):  # the same fields present (values move: power, energy)
            assert [f is None for f in vars(h).values()] == [
                f is None for f in vars(first).values()
            ]
            assert set(h.ecc_errors) == set(first.ecc_errors)


def test_profile_tables_read_once_equal_a_fresh_read(session: NvmlSession) -> None:
    """The GI and CI profile tables are read once per session: a later inventory read (from
    the tables kept) equals one that read them from NVML."""
    with session.lock:
        session.static.clear()  # the module's session: earlier tests filled it
    first = read_inventory(session)
    kept = read_inventory(session)
    assert [g.profiles for g in kept.gpus] == [g.profiles for g in first.gpus]
    assert [[(s.gi_id, s.ci_id, s.ci_slice_count) for s in g.slices] for g in kept.gpus] == [
        [(s.gi_id, s.ci_id, s.ci_slice_count) for s in g.slices] for g in first.gpus
    ]
