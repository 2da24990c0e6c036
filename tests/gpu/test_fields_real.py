"""Field values on a real GPU (the lent H200), no load needed: memory temperature, remapped
rows, NVLink and PCIe counters, engine utilizations, reserved memory read in one field-value
call; the native and the dcgm-compat expositions parse, with sane values. Prints what was read,
for comparison with the emulator's H200. Read-only: no setting of the GPU is changed."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.fields import FieldReader
from nodeagent.nvml.session import gpu_handle
from tests.support.agent import make_agent

pytestmark = pytest.mark.gpu
SERIES = re.compile(r"^(DCGM_FI_\w+)\{(.*)\} (\S+)$")


def test_field_values_are_plausible(session: NvmlSession) -> None:
    reader = FieldReader(session)
    for gpu in read_inventory(session).gpus:
        dev = gpu_handle(session, gpu.index)
        first = reader.read(gpu.index, dev, gpu.mig_current)
        time.sleep(1.0)
        second = reader.read(gpu.index, dev, gpu.mig_current)
        print(f"GPU {gpu.index} {gpu.name}: {first}\nthen: {second}")
        # HBM boards (every data-centre GPU that runs MIG) report the memory temperature.
        t = second.memory_temperature_celsius
        assert t is not None and 10 <= t <= 110
        assert second.remapped_rows_correctable is not None
        assert second.remapped_rows_uncorrectable is not None
        assert 0 <= second.remapped_rows_uncorrectable < 10_000
        assert second.memory_reserved_bytes is not None
        assert 0 < second.memory_reserved_bytes < gpu.memory_total_bytes // 10
        for before, after in (
            (first.pcie_tx_bytes, second.pcie_tx_bytes),
            (first.pcie_rx_bytes, second.pcie_rx_bytes),
            (first.nvlink_tx_bytes, second.nvlink_tx_bytes),
            (first.nvlink_rx_bytes, second.nvlink_rx_bytes),
        ):
            if before is not None:  # NVLink: absent on a GPU without it
                assert after is not None and after >= before >= 0
        if not gpu.mig_current:
            for ratio in (second.encoder_utilization, second.decoder_utilization):
                assert ratio is None or 0.0 <= ratio <= 1.0


def test_native_and_dcgm_expositions_parse_with_sane_values(session: NvmlSession) -> None:
    agent = make_agent(session, lambda _index: None, metrics={"dcgm_compat": True})
    try:
        agent.refresh()
        agent.gpm.tick()
        time.sleep(1.0)
        agent.refresh()  # PCIe rates need two reads
        agent.gpm.tick()  # GPM ratios too
        text = agent.exposition.latest().decode()
        gpm = bool(agent.store.gpm.by_gpu)
    finally:
        agent.gpm.close()
        agent.health.close()
    native = {f.name: f for f in text_string_to_metric_families(
        "\n".join(line for line in text.splitlines() if "DCGM_FI_" not in line) + "\n"
    )}  # fmt: skip
    temperature = native["nodeagent_gpu_memory_temperature_celsius"].samples
    assert temperature and all(10 <= s.value <= 110 for s in temperature)
    assert native["nodeagent_gpu_memory_reserved_bytes"].samples
    dcgm: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if match:
            dcgm.setdefault(match[1], []).append(float(match[3]))
    print({name: values[:2] for name, values in sorted(dcgm.items())})
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_FB_FREE"):
        assert dcgm[name] and all(v > 0 for v in dcgm[name])
    assert all(0 <= v <= 100 for v in dcgm.get("DCGM_FI_DEV_GPU_UTIL", []))
    assert all(0 <= v <= 1e11 for v in dcgm.get("DCGM_FI_PROF_PCIE_TX_BYTES", []))
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert (name in dcgm) == gpm  # Hopper and later: GPM
        assert all(0.0 <= v <= 1.0 for v in dcgm.get(name, []))
