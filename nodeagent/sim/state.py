"""The emulated GPUs' mutable state (its file is read, checked and written by statefile.py)."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from nodeagent.sim.models import MAX_GPUS, NO_RESET, load_model

STATE_VERSION = 1
_UUID_NAMESPACE = uuid.UUID("6d1f5c8e-3f0a-4c0b-9a43-1f7e2b9c4d10")
UUID_SERIALS = 2**63 - 1  # a GPU's MIG UUID serials: 0 .. 2**63 - 2 (a signed 64-bit range)
# Bus numbers as a DGX-style board enumerates its 8 (then 16) GPUs; GPUs past those take the
# other buses of PCI domain 0 in order (bus 0 is the root complex's): one bus each, 255 in all.
_EIGHT = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_BOARD_BUSES = _EIGHT + tuple(bus + 1 for bus in _EIGHT)
BUSES = _BOARD_BUSES + tuple(b for b in range(1, 256) if b not in _BOARD_BUSES)
assert len(BUSES) == MAX_GPUS, "one PCI bus per emulated GPU"


@dataclass
class CiState:
    id: int
    profile_id: int
    uuid: str
    start: int = 0  # compute slice inside the GI


@dataclass
class GiState:
    id: int
    profile_id: int
    start: int
    size: int
    cis: dict[int, CiState] = field(default_factory=dict)


@dataclass
class ProcessState:
    pid: int
    gpu: int
    memory_bytes: int
    gi_id: int | None = None
    ci_id: int | None = None
    load: float = 1.0
    mps_client: bool = False  # a client of an MPS server (its server is a process of its own)


XID_LOG = 64  # the newest XIDs a GPU keeps for event sets that have not read them yet


@dataclass
class HealthState:
    """What `nodeagent sim health` / `sim xid` set; None values follow the emulated load."""

    temperature_celsius: int | None = None
    power_watts: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle: list[str] | None = None  # reason names; None: from load, temperature and power
    ecc_corrected: int = 0  # since the emulated driver loaded (aggregate)
    ecc_uncorrected: int = 0
    # The counts at the GPU's last reset: the volatile counts are those since then.
    ecc_corrected_at_reset: int = 0
    ecc_uncorrected_at_reset: int = 0
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (an nvmlDeviceGpuRecoveryAction_t); None: the emulated
    # driver does not report it (before R565).
    recovery_action: int | None = 0
    row_remap_pending: int = 0
    row_remap_failure: int = 0
    pcie_replays: int = 0
    energy_mj: int = 0  # energy used up to energy_at (wall clock)
    energy_at: float = field(default_factory=time.time)
    xid_serial: int = 0  # XIDs injected so far
    xids: list[int] = field(default_factory=list)  # the newest XID_LOG codes, oldest first
    # The GPU instance each of `xids` hit (None: the whole GPU); shorter in an older file.
    xid_gis: list[int | None] = field(default_factory=list)


@dataclass
class GpuState:
    index: int
    model: str
    uuid: str
    pci_bus_id: str
    mig_current: int = 0
    mig_pending: int = 0
    gis: dict[int, GiState] = field(default_factory=dict)
    compute_mode: int = 0
    uuid_serial: int = 0
    health: HealthState = field(default_factory=HealthState)
    # The platform does not expose a GPU reset (pass-through virtualization, per NVML's
    # nvmlDeviceSetMigMode docs): a pending MIG mode (Ampere) waits for a reboot (':no-reset').
    reset_refused: bool = False

    def new_mig_uuid(self) -> str:
        """A MIG device UUID not in use on this GPU. The serial wraps within what the state
        file's loader reads back (UUID_SERIALS), so whatever is written can be read again."""
        live = {ci.uuid for gi in self.gis.values() for ci in gi.cis.values()}
        while True:
            self.uuid_serial = (self.uuid_serial + 1) % UUID_SERIALS
            made = "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{self.uuid}/{self.uuid_serial}"))
            if made not in live:
                return made


@dataclass
class SimState:
    gpus: list[GpuState]
    processes: list[ProcessState] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        """The model keys as a simulate spec names them (with ':no-reset' where it applies)."""
        return [g.model + (NO_RESET if g.reset_refused else "") for g in self.gpus]


def fresh_state(models: list[str]) -> SimState:
    """A node just booted: MIG off on every GPU, no instances, no processes."""
    gpus = []
    for index, spec_key in enumerate(models):
        key = spec_key.removesuffix(NO_RESET)
        load_model(key)
        gpu_uuid = "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"gpu/{index}/{key}"))
        bus = f"00000000:{BUSES[index]:02X}:00.0"
        refused = spec_key.endswith(NO_RESET)
        gpus.append(GpuState(index, key, gpu_uuid, bus, reset_refused=refused))
    return SimState(gpus=gpus)


def to_json(state: SimState) -> dict[str, Any]:
    return {"version": STATE_VERSION, **asdict(state)}
