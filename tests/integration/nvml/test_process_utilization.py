"""Per-process utilization through nodeagent.nvml on the emulator: each driver sample counted
once, NOT_SUPPORTED under MIG on every model (as nvml.h says), a GPU that cannot answer not
asked again."""

from __future__ import annotations

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.mig.config import parse_config
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.codes import NOT_FOUND, NOT_SUPPORTED
from nodeagent.nvml.utilization import ProcessUtilizationReader, read_rates
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml, parse_spec
from nodeagent.sim.utilizationcalls import SAMPLE_PERIOD_US
from tests.support.mig_apply import reconfigure

GIB = 1024**3
PERIOD = SAMPLE_PERIOD_US / 1e6
# Ampere (no GPM) and Hopper: real NVML answers per-process utilization on both with MIG off.
MODELS = ["a100-40gb", "a100-80gb", "a30", "h100-80gb", "h200"]
ONE_SLICE = {
    "a100-40gb": "1g.5gb",
    "a100-80gb": "1g.10gb",
    "a30": "1g.6gb",
    "h100-80gb": "1g.10gb",
    "h200": "1g.18gb",
}


def _node(spec: str) -> tuple[SimulatedNvml, NvmlSession, list[float]]:
    lib = SimulatedNvml(parse_spec(spec))
    now = [1_700_000_000.0]
    lib.health_clock = lambda: now[0]
    return lib, NvmlSession(lib), now


@pytest.mark.parametrize("model", MODELS)
def test_each_sample_counts_once(model: str) -> None:
    lib, session, now = _node(model)
    lib.attach("0", 4242, GIB, 0.35)
    lib.attach("0", 4243, GIB, 0.0)  # idle: NVML sends no sample for it
    reader = ProcessUtilizationReader(session)
    uuid = read_inventory(session).gpus[0].uuid
    first = reader.read(0, uuid)
    assert first is not None and set(first) == {4242}
    assert (first[4242].sm, first[4242].memory) == (0.35, 0.08)
    assert (first[4242].encoder, first[4242].decoder) == (0.0, 0.0)
    assert reader.read(0, uuid) == {}  # the same driver sample is not counted again
    now[0] += PERIOD
    again = reader.read(0, uuid)
    assert again is not None and again[4242].sm == 0.35
    assert again[4242].timestamp_us > first[4242].timestamp_us
    assert session.error_counts() == {}  # "no sample since" is an answer, not an error


@pytest.mark.parametrize("model", MODELS)
def test_not_supported_under_mig(model: str) -> None:
    lib, session, _ = _node(model)
    config = f"""\
version: v1
mig-configs:
  one:
    - devices: all
      mig-enabled: true
      mig-devices: {{"{ONE_SLICE[model]}": 1}}
"""
    reconfigure(session, parse_config(config, "one.yaml"), "one", lib.reset)
    gpu = read_inventory(session).gpus[0]
    mig_uuid = gpu.slices[0].mig_uuid or ""
    lib.attach(mig_uuid, 4242, GIB, 1.0)
    assert read_rates(session, 0) is None
    reader = ProcessUtilizationReader(session)
    assert reader.read(0, gpu.uuid) is None
    assert reader.read(0, gpu.uuid) is None  # not asked again
    assert session.error_counts() == {"nvmlDeviceGetProcessUtilization": 1}
    mig = session.call("nvmlDeviceGetHandleByUUID", mig_uuid)
    with pytest.raises(NvmlError) as err:
        session.call("nvmlDeviceGetProcessUtilization", mig, 0)
    assert err.value.code == NOT_SUPPORTED


def test_no_busy_process_is_not_found() -> None:
    _lib, session, _ = _node("a100-40gb")
    dev = session.call("nvmlDeviceGetHandleByIndex", 0)
    with pytest.raises(NvmlError) as err:
        session.call("nvmlDeviceGetProcessUtilization", dev, 0)
    assert err.value.code == NOT_FOUND
    assert ProcessUtilizationReader(session).read(0, "GPU-x") == {}


def test_a_gpu_that_answers_not_supported_is_asked_once() -> None:
    rule = Fault(function="nvmlDeviceGetProcessUtilization", error=NOT_SUPPORTED)
    lib = SimulatedNvml(parse_spec("a30"), faults=FaultPlan([rule]))
    session = NvmlSession(lib)
    lib.attach("0", 7, GIB, 1.0)
    reader = ProcessUtilizationReader(session)
    assert [reader.read(0, "GPU-a30") for _ in range(3)] == [None, None, None]
    assert session.error_counts() == {"nvmlDeviceGetProcessUtilization": 1}
    reader.forget("GPU-a30")  # its MIG mode changed: ask again
    assert reader.read(0, "GPU-a30") is None
    assert session.error_counts() == {"nvmlDeviceGetProcessUtilization": 2}
