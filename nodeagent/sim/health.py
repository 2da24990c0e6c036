"""Health counters of the emulated GPUs: temperature, power, energy, clocks, clock-event
reasons, ECC, row remapping, PCIe replays, XIDs.

Values follow the emulated load (the processes' `load`, as GPM does) unless `nodeagent sim
health` set them. Power limits are the boards' spec-sheet TDPs; idle power, temperatures and
clocks are typical `nvidia-smi -q` values of each family (the H200's idle clocks and memory
clock as the lent H200 shows them), not measurements of every model.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.sim.gpm import node_activity
from nodeagent.sim.models import load_model
from nodeagent.sim.state import XID_LOG, GpuState, SimState

MAX_TEMPERATURE = 200  # degrees C; a state file or flag above it is refused
# nvmlDeviceGpuRecoveryAction_t by the name `sim health --recovery-action` takes (nvml.h's
# NVML_GPU_RECOVERY_ACTION_*: NONE ... SYSTEM_REBOOT); "unsupported": a driver before R565.
RECOVERY_ACTIONS = {
    "none": 0,
    "gpu-reset": 1,
    "node-reboot": 2,
    "drain-p2p": 3,
    "drain-and-reset": 4,
    "recover-imex-domain": 5,
    "bus-reset": 6,
    "system-reboot": 7,
}
MAX_RECOVERY_ACTION = max(RECOVERY_ACTIONS.values())
REBOOT_ACTIONS = frozenset({2, 7})  # a GPU reset does not do what these ask
MAX_WATTS = 5000.0
SLOWDOWN_CELSIUS = 87  # software thermal slowdown starts (nvidia-smi "GPU Slowdown Temp" ~ 87-90)
# nvmlClocksEventReason* bits by name (nodeagent.nvml.health decodes the same table).
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
REASON_NAMES = tuple(REASON_BITS)


@dataclass(frozen=True)
class HealthModel:
    limit_watts: float
    idle_watts: float
    sm_idle_mhz: int
    sm_max_mhz: int
    memory_mhz: int
    idle_celsius: int = 30
    busy_celsius: int = 66


_AMPERE = HealthModel(400, 60, 210, 1410, 1593)
_HOPPER = HealthModel(700, 75, 345, 1980, 2619)
_BLACKWELL = HealthModel(1000, 140, 120, 1965, 3996)
_BY_ARCHITECTURE = {7: _AMPERE, 9: _HOPPER, 10: _BLACKWELL}
_BY_MODEL = {
    "h200": HealthModel(700, 75, 345, 1980, 3201),
    "h100-80gb": _HOPPER,
    "h100-96gb": _HOPPER,
    "h800": _HOPPER,
    "h100-pcie": HealthModel(350, 50, 345, 1755, 1593),
    "h800-pcie": HealthModel(350, 50, 345, 1755, 1593),
    "h100-nvl": HealthModel(400, 60, 345, 1785, 2619),
    "h800-nvl": HealthModel(400, 60, 345, 1785, 2619),
    "h20": HealthModel(400, 60, 345, 1980, 2619),
    "gh200-96gb": HealthModel(900, 90, 345, 1980, 2619),
    "gh200-144gb": HealthModel(1000, 90, 345, 1980, 3201),
    "a100-40gb": HealthModel(400, 55, 210, 1410, 1215),
    "a100-80gb": _AMPERE,
    "a800-40gb": HealthModel(400, 55, 210, 1410, 1215),
    "a800-80gb": _AMPERE,
    "a100-pcie-40gb": HealthModel(250, 35, 210, 1410, 1215),
    "a100-pcie-80gb": HealthModel(300, 45, 210, 1410, 1512),
    "a800-80gb-pcie": HealthModel(300, 45, 210, 1410, 1512),
    "a30": HealthModel(165, 30, 210, 1440, 1215),
    "b200": _BLACKWELL,
    "gb200": HealthModel(1200, 150, 120, 1965, 3996),
    "b300": HealthModel(1100, 150, 120, 1965, 3996),
    "gb300": HealthModel(1400, 160, 120, 1965, 3996),
    "rtx-pro-6000": HealthModel(600, 40, 180, 2617, 14001, idle_celsius=35, busy_celsius=75),
}


def health_model(key: str) -> HealthModel:
    return _BY_MODEL.get(key) or _BY_ARCHITECTURE.get(load_model(key).architecture, _HOPPER)


def power_watts(gpu: GpuState, load: float) -> float:
    """`load`: the share of the GPU's SMs kept busy (0-1), as GPM sees it."""
    if gpu.health.power_watts is not None:
        return gpu.health.power_watts
    m = health_model(gpu.model)
    return round(m.idle_watts + load * (0.85 * m.limit_watts - m.idle_watts), 3)


def temperature_celsius(gpu: GpuState, load: float) -> int:
    if gpu.health.temperature_celsius is not None:
        return gpu.health.temperature_celsius
    m = health_model(gpu.model)
    return round(m.idle_celsius + load * (m.busy_celsius - m.idle_celsius))


def sm_clock_mhz(gpu: GpuState, load: float) -> int:
    if gpu.health.sm_clock_mhz is not None:
        return gpu.health.sm_clock_mhz
    m = health_model(gpu.model)
    return m.sm_max_mhz if load > 0 else m.sm_idle_mhz


def memory_clock_mhz(gpu: GpuState) -> int:
    if gpu.health.memory_clock_mhz is not None:
        return gpu.health.memory_clock_mhz
    return health_model(gpu.model).memory_mhz


def throttle_mask(gpu: GpuState, load: float) -> int:
    """Set reasons, or: idle without load, software thermal slowdown from SLOWDOWN_CELSIUS,
    software power cap at the limit."""
    if gpu.health.throttle is not None:
        return sum(REASON_BITS[name] for name in set(gpu.health.throttle))
    mask = 0 if load > 0 else REASON_BITS["gpu_idle"]
    if temperature_celsius(gpu, load) >= SLOWDOWN_CELSIUS:
        mask |= REASON_BITS["sw_thermal_slowdown"]
    if power_watts(gpu, load) >= health_model(gpu.model).limit_watts:
        mask |= REASON_BITS["sw_power_cap"]
    return mask


# NVML's counter types: energy (mJ) and ECC counts are unsigned 64-bit, PCIe replays 32-bit.
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1


def energy_mj(gpu: GpuState, load: float, now: float) -> int:
    """Energy since the emulated driver loaded: the energy up to the last change of load, plus
    the present power since then (power only changes with a checkpoint, so it never falls).
    An unsigned 64-bit counter, as nvmlDeviceGetTotalEnergyConsumption's: it wraps to 0."""
    elapsed = max(now - gpu.health.energy_at, 0.0)
    return (gpu.health.energy_mj + int(power_watts(gpu, load) * elapsed * 1000)) % (U64_MAX + 1)


def add_errors(count: int, more: int, most: int) -> int:
    """An error counter after `more` errors: it stops at `most` (the counter's largest value),
    as the driver's ECC and replay counters do, never wraps to a small count."""
    return min(count + more, most)


def checkpoint_energy(state: SimState, now: float) -> None:
    """Fold the energy used so far into the state; call before anything changes the power."""
    loads = node_activity(state).gpus
    for gpu in state.gpus:
        gpu.health.energy_mj = energy_mj(gpu, loads[gpu.index], now)
        gpu.health.energy_at = max(now, gpu.health.energy_at)


def volatile_ecc(gpu: GpuState, uncorrected: bool) -> int:
    """The errors since the GPU's last reset (the driver's volatile counter)."""
    h = gpu.health
    if uncorrected:
        return h.ecc_uncorrected - h.ecc_uncorrected_at_reset
    return h.ecc_corrected - h.ecc_corrected_at_reset


def reset_health(gpu: GpuState) -> None:
    """What a GPU reset does to its health: the volatile ECC counters start again, a pending
    row remap is done (NVIDIA: "reset the GPU to activate"), and a recovery action the reset
    answers (every one but a reboot) goes back to NONE."""
    h = gpu.health
    h.ecc_corrected_at_reset, h.ecc_uncorrected_at_reset = h.ecc_corrected, h.ecc_uncorrected
    h.row_remap_pending = 0
    if h.recovery_action is not None and h.recovery_action not in REBOOT_ACTIONS:
        h.recovery_action = 0


def reboot_health(gpu: GpuState) -> None:
    """What a reboot does: a reset, and no recovery action is left to do."""
    reset_health(gpu)
    if gpu.health.recovery_action is not None:
        gpu.health.recovery_action = 0


def record_xid(gpu: GpuState, xid: int, gi: int | None = None) -> None:
    """XID `xid` on `gpu`, of its GPU instance `gi` (None: of the whole GPU)."""
    h = gpu.health
    gis = [*h.xid_gis, *[None] * (len(h.xids) - len(h.xid_gis))]  # an older file's: GPU-wide
    h.xid_serial = min(h.xid_serial + 1, U64_MAX)
    h.xids = [*h.xids, xid][-XID_LOG:]
    h.xid_gis = [*gis, gi][-XID_LOG:]


def xid_after(gpu: GpuState, serial: int) -> tuple[int, int, int | None] | None:
    """The first XID with a serial above `serial` still kept, as (serial, code, GPU instance
    or None); older ones a reader did not take in time are lost, as in a full driver queue."""
    h = gpu.health
    if serial >= h.xid_serial or not h.xids:
        return None
    first = h.xid_serial - len(h.xids) + 1
    wanted = max(serial + 1, first)
    at = wanted - first
    return wanted, h.xids[at], h.xid_gis[at] if at < len(h.xid_gis) else None
