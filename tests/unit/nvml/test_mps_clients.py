"""NVML's MPS clients (nodeagent.nvml.utilization.read_mps_clients) on the emulator: the clients
with their memory, never the server; on a MIG device its own clients; None where the driver
answers "not supported" or lacks the call."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.nvml import NvmlSession, Placement, read_inventory
from nodeagent.nvml.health import mig_handle
from nodeagent.nvml.session import gpu_handle
from nodeagent.nvml.utilization import read_mps_clients
from nodeagent.nvml.write import MigWriter
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault, FaultPlan

MIB = 1 << 20


def test_the_clients_are_listed_with_their_memory_and_the_server_is_not() -> None:
    lib = SimulatedNvml(parse_spec("h100-80gb"))
    lib.attach("0", 100, 66 * MIB)  # the MPS server
    lib.attach("0", 101, 512 * MIB, mps_client=True)
    lib.attach("0", 102, 2048 * MIB, mps_client=True)
    session = NvmlSession(lib)
    assert read_mps_clients(session, gpu_handle(session, 0)) == {101: 512 * MIB, 102: 2048 * MIB}
    # The compute list has all three, as on a real H200.
    listed = session.call("nvmlDeviceGetComputeRunningProcesses", gpu_handle(session, 0))
    assert sorted(int(p.pid) for p in listed) == [100, 101, 102]


def test_a_mig_device_lists_its_own_clients() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    gi = writer.create_gpu_instance(0, 19, Placement(3, 1))  # 1g.18gb
    writer.create_compute_instance(0, gi, 1, 0, full=True)
    (uuid,) = [s.mig_uuid for s in read_inventory(session).gpus[0].slices]
    assert uuid is not None
    lib.attach(uuid, 200, 10 * MIB, mps_client=True)
    lib.attach(uuid, 201, 10 * MIB)
    assert read_mps_clients(session, mig_handle(session, uuid)) == {200: 10 * MIB}


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_a_driver_that_does_not_list_them_answers_none(code: int) -> None:
    fault = Fault(function="nvmlDeviceGetMPSComputeRunningProcesses", error=code)
    lib = SimulatedNvml(parse_spec("h100-80gb"), faults=FaultPlan([fault]))
    lib.attach("0", 101, MIB, mps_client=True)
    session = NvmlSession(lib)
    assert read_mps_clients(session, gpu_handle(session, 0)) is None
    assert session.error_counts() == {}  # an answer, not a failure
