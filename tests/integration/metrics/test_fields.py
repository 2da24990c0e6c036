"""Field-value series from the emulator: memory temperature, memory-copy and engine
utilization, reserved memory, NVLink and PCIe traffic, remapped rows; absent where the model
answers NOT_SUPPORTED (no HBM sensor, no NVLink) and the engine utilizations absent on MIG GPUs,
as real NVML does."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.codes import NOT_SUPPORTED
from nodeagent.nvml.fields import MEMORY_V2, FieldReader
from nodeagent.nvml.health import mig_handle
from nodeagent.nvml.session import gpu_handle
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.metrics import sample

Families = dict[str, dict[frozenset[tuple[str, str]], float]]


def families(agent: Agent) -> Families:
    found: Families = {}
    for family in text_string_to_metric_families(generate_latest(agent.registry).decode()):
        for s in family.samples:
            found.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return found


def test_values_follow_the_model_and_the_load(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, lib = agent_factory("h200x2", None, [(0, "", 1.0)])
    lib.set_health(1, row_remap_pending=1)
    before = families(agent)["nodeagent_gpu_pcie_bytes_total"]
    agent.monotonic.offset += 5.0  # type: ignore[attr-defined]
    sample(agent)
    found = families(agent)
    busy, idle = frozenset({("gpu", "0")}), frozenset({("gpu", "1")})
    assert found["nodeagent_gpu_memory_temperature_celsius"] == {busy: 72.0, idle: 36.0}
    assert found["nodeagent_gpu_memory_copy_utilization_ratio"] == {busy: 0.22, idle: 0.0}
    assert found["nodeagent_gpu_memory_reserved_bytes"][idle] == 644939776  # the H200's
    engines = found["nodeagent_gpu_engine_utilization_ratio"]
    assert len(engines) == 4 and set(engines.values()) == {0.0}
    rows = found["nodeagent_gpu_remapped_rows_total"]
    assert rows[frozenset({("gpu", "1"), ("cause", "uncorrectable")})] == 1.0
    assert rows[frozenset({("gpu", "1"), ("cause", "correctable")})] == 0.0
    assert set(found["nodeagent_gpu_nvlink_bytes_total"].values()) == {0.0}  # no collectives
    pcie = found["nodeagent_gpu_pcie_bytes_total"]
    assert all(pcie[k] >= before[k] for k in before)
    tx, rx = (frozenset({("gpu", "0"), ("direction", d)}) for d in ("tx", "rx"))
    assert 0 < pcie[tx] < pcie[rx]
    assert 0.9 < found["nodeagent_gpu_graphics_active_ratio"][busy] <= 1.0


@pytest.mark.parametrize(
    "spec,absent",
    [
        # GDDR7, no NVLink: no memory sensor
        (
            "rtx-pro-6000",
            {"nodeagent_gpu_memory_temperature_celsius", "nodeagent_gpu_nvlink_bytes_total"},
        ),
        ("a30", {"nodeagent_gpu_nvlink_bytes_total"}),  # PCIe card
        ("h100-pcie", {"nodeagent_gpu_nvlink_bytes_total"}),
        ("h200", set()),
    ],
)
def test_unsupported_fields_have_no_series(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]], spec: str, absent: set[str]
) -> None:
    agent, _ = agent_factory(spec, None, [])
    found = families(agent)
    every = {
        "nodeagent_gpu_memory_temperature_celsius",
        "nodeagent_gpu_nvlink_bytes_total",
        "nodeagent_gpu_pcie_bytes_total",
        "nodeagent_gpu_remapped_rows_total",
        "nodeagent_gpu_memory_reserved_bytes",
    }
    assert {name for name in every if not found.get(name)} == absent


def test_mig_gpu_has_no_engine_utilization_and_mig_handles_no_fields(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, lib = agent_factory("h200", "all-balanced", [])
    found = families(agent)
    assert not found.get("nodeagent_gpu_engine_utilization_ratio")
    assert not found.get("nodeagent_gpu_memory_copy_utilization_ratio")
    assert found["nodeagent_gpu_memory_temperature_celsius"]  # the GPU's own, under MIG too
    session = NvmlSession(lib)
    mig = agent.store.snapshot.inventory.gpus[0].slices[0].mig_uuid  # type: ignore[union-attr]
    assert mig is not None
    answer = lib.nvmlDeviceGetFieldValues(mig_handle(session, mig), [82, (140, 0xFFFFFFFF)])
    assert [int(slot.nvmlReturn) for slot in answer] == [NOT_SUPPORTED, NOT_SUPPORTED]


def test_memory_info_v2_reports_the_reserved_memory_apart() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    lib.attach("0", 900, 3 * 1024**3, 0.5)
    dev = gpu_handle(session, 0)
    v1, v2 = lib.nvmlDeviceGetMemoryInfo(dev), lib.nvmlDeviceGetMemoryInfo(dev, MEMORY_V2)
    assert v2.reserved == 644939776 and v2.used == 3 * 1024**3
    assert v2.total == v1.total == v2.used + v2.reserved + v2.free
    assert v1.used == v2.used + v2.reserved
    assert FieldReader(session).read(0, dev, False).memory_reserved_bytes == v2.reserved
