"""dcgm-exporter's default counters (its etc/default-counters.csv at d5e5f51): name, type, help
and where nodeagent's snapshot holds each value, per entity (a whole GPU, or one GPU instance
of a MIG GPU as dcgm-exporter's default `-d f` monitors it).

Device-wide values (clocks, temperatures, power, energy, errors, NVLink) are the GPU's on each
of its GPU instances, as DCGM reports them; framebuffer and profiling values are the GPU
instance's own; the utilization rates and PCIe rates exist for whole GPUs only (NVML gives
neither per GPU instance; DCGM leaves the rates blank under MIG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nodeagent.state.snapshot import DeviceFields, Health

MIB = 1024 * 1024


@dataclass(frozen=True)
class Entity:
    """What one entity's series are read from. `gi` None: a whole GPU."""

    health: Health | None
    fields: DeviceFields | None
    gpm: dict[str, float]
    utilization: float | None
    memory_utilization: float | None
    memory: tuple[int, int, int | None]  # (total, used incl. reserved, reserved) bytes
    pcie_rates: tuple[float, float] | None
    last_xid: int | None
    gi: tuple[str, int] | None = None  # (profile, GPU instance id)


Value = Callable[[Entity], float | None]


def _health(read: Callable[[Health], float | int | bool | None]) -> Value:
    def value(e: Entity) -> float | None:
        v = None if e.health is None else read(e.health)
        return None if v is None else float(v)

    return value


def _fields(read: Callable[[DeviceFields], float | int | None]) -> Value:
    def value(e: Entity) -> float | None:
        v = None if e.fields is None else read(e.fields)
        return None if v is None else float(v)

    return value


def _whole(read: Callable[[Entity], float | None]) -> Value:
    """A value NVML gives for whole GPUs only."""
    return lambda e: None if e.gi is not None else read(e)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio * 100)


def _mib(n: int | None) -> float | None:
    return None if n is None else float(n // MIB)


def _fb_used(e: Entity) -> float | None:
    _, used, reserved = e.memory
    return _mib(used - (reserved or 0))


def _fb_free(e: Entity) -> float | None:
    total, used, _ = e.memory
    return _mib(max(total - used, 0))


def _nvlink_kib(f: DeviceFields) -> int | None:
    if f.nvlink_tx_bytes is None or f.nvlink_rx_bytes is None:
        return None
    return (f.nvlink_tx_bytes + f.nvlink_rx_bytes) // 1024


def _gpm(name: str) -> Value:
    return lambda e: e.gpm.get(name)


def _rate(i: int) -> Value:
    return _whole(lambda e: None if e.pcie_rates is None else e.pcie_rates[i])


# Field name -> how its value is read. The type and help come from default-counters.csv.
VALUES: dict[str, Value] = {
    "DCGM_FI_DEV_SM_CLOCK": _health(
        lambda h: None if h.sm_clock_hertz is None else h.sm_clock_hertz // 1_000_000
    ),
    "DCGM_FI_DEV_MEM_CLOCK": _health(
        lambda h: None if h.memory_clock_hertz is None else h.memory_clock_hertz // 1_000_000
    ),
    "DCGM_FI_DEV_MEMORY_TEMP": _fields(lambda f: f.memory_temperature_celsius),
    "DCGM_FI_DEV_GPU_TEMP": _health(lambda h: h.temperature_celsius),
    "DCGM_FI_DEV_POWER_USAGE": _health(lambda h: h.power_watts),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _health(
        lambda h: None if h.energy_joules is None else round(h.energy_joules * 1000)
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _health(lambda h: h.pcie_replays),
    "DCGM_FI_DEV_GPU_UTIL": _whole(lambda e: _percent(e.utilization)),
    "DCGM_FI_DEV_MEM_COPY_UTIL": _whole(lambda e: _percent(e.memory_utilization)),
    "DCGM_FI_DEV_ENC_UTIL": _whole(
        lambda e: None if e.fields is None else _percent(e.fields.encoder_utilization)
    ),
    "DCGM_FI_DEV_DEC_UTIL": _whole(
        lambda e: None if e.fields is None else _percent(e.fields.decoder_utilization)
    ),
    "DCGM_FI_DEV_XID_ERRORS": lambda e: None if e.last_xid is None else float(e.last_xid),
    "DCGM_FI_DEV_FB_FREE": _fb_free,
    "DCGM_FI_DEV_FB_USED": _fb_used,
    "DCGM_FI_DEV_FB_RESERVED": _whole(lambda e: _mib(e.memory[2])),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _fields(_nvlink_kib),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _fields(lambda f: f.remapped_rows_uncorrectable),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _fields(lambda f: f.remapped_rows_correctable),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _health(lambda h: h.row_remap_failure),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _gpm("graphics_active"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _gpm("tensor_active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": _gpm("dram_active"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _rate(0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _rate(1),
}

# Default counters nodeagent does not emit, and why (the README lists them too).
NOT_EMITTED = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU guests only: nodeagent runs on bare-metal GPUs,"
    " where DCGM leaves this field blank and dcgm-exporter emits no series either",
}

# Every default counter: field, Prometheus type, help (default-counters.csv's rows, in order).
_DEFAULT_COUNTERS = """\
DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL, gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL, gauge, Decoder utilization (in %).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total number of NVLink bandwidth counters for all \
lanes.
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION, label, Driver Version
DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE, gauge, Ratio of cycles the device memory interface is active sending \
or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES, gauge, The rate of data transmitted over the PCIe bus - including \
both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES, gauge, The rate of data received over the PCIe bus - including both \
protocol headers and data payloads - in bytes per second.
"""
COUNTERS: tuple[tuple[str, str, str], ...] = tuple(
    (field, kind, text)
    for field, kind, text in (
        (part.strip() for part in line.split(",", 2)) for line in _DEFAULT_COUNTERS.splitlines()
    )
)
