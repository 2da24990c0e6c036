"""The emulated GPUs' mutable state, and its JSON file (written atomically)."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.errors import SimError
from nodeagent.files import atomic_write_text
from nodeagent.sim.models import load_model

STATE_VERSION = 1
_UUID_NAMESPACE = uuid.UUID("6d1f5c8e-3f0a-4c0b-9a43-1f7e2b9c4d10")
# Bus numbers as a DGX-style 8-GPU board enumerates them.
_BUSES = (
    0x18,
    0x2A,
    0x3A,
    0x5D,
    0x9A,
    0xAB,
    0xBA,
    0xDB,
    0x19,
    0x2B,
    0x3B,
    0x5E,
    0x9B,
    0xAC,
    0xBB,
    0xDC,
)


@dataclass
class CiState:
    id: int
    profile_id: int
    uuid: str


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

    def new_mig_uuid(self) -> str:
        self.uuid_serial += 1
        return "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{self.uuid}/{self.uuid_serial}"))


@dataclass
class SimState:
    gpus: list[GpuState]
    processes: list[ProcessState] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        return [g.model for g in self.gpus]


def fresh_state(models: list[str]) -> SimState:
    """A node just booted: MIG off on every GPU, no instances, no processes."""
    gpus = []
    for index, key in enumerate(models):
        load_model(key)
        gpu_uuid = "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"gpu/{index}/{key}"))
        bus = f"00000000:{_BUSES[index % len(_BUSES)]:02X}:00.0"
        gpus.append(GpuState(index=index, model=key, uuid=gpu_uuid, pci_bus_id=bus))
    return SimState(gpus=gpus)


def to_json(state: SimState) -> dict[str, Any]:
    return {"version": STATE_VERSION, **asdict(state)}


def from_json(data: Any, source: str) -> SimState:
    """Rebuild a SimState from its JSON form; raises SimError naming `source` if malformed."""
    try:
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"expected an object with version {STATE_VERSION}")
        gpus = []
        for g in data["gpus"]:
            gis = {}
            for gi in g["gis"].values():
                cis = {int(c["id"]): CiState(**c) for c in gi["cis"].values()}
                gis[int(gi["id"])] = GiState(
                    id=int(gi["id"]),
                    profile_id=int(gi["profile_id"]),
                    start=int(gi["start"]),
                    size=int(gi["size"]),
                    cis=cis,
                )
            load_model(g["model"])
            gpus.append(
                GpuState(
                    index=int(g["index"]),
                    model=str(g["model"]),
                    uuid=str(g["uuid"]),
                    pci_bus_id=str(g["pci_bus_id"]),
                    mig_current=int(g["mig_current"]),
                    mig_pending=int(g["mig_pending"]),
                    gis=gis,
                    uuid_serial=int(g["uuid_serial"]),
                    compute_mode=int(g.get("compute_mode", 0)),
                )
            )
        processes = [ProcessState(**p) for p in data["processes"]]
    except SimError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise SimError(f"emulator state file {source} is corrupt: {err}") from err
    return SimState(gpus=gpus, processes=processes)


def load_state(path: Path) -> SimState | None:
    """Read the state file, or None when it does not exist yet. Raises SimError if corrupt."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SimError(f"cannot read emulator state file {path}: {err.strerror}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SimError(
            f"emulator state file {path} is corrupt: not JSON (line {err.lineno}: {err.msg})"
        ) from err
    return from_json(data, str(path))


def save_state(path: Path, state: SimState) -> None:
    """Write the state file atomically: a temporary file in the same folder, then rename."""
    # Emulated state is test/demo data: atomicity matters to readers, durability does not.
    atomic_write_text(path, json.dumps(to_json(state), indent=1, sort_keys=True), durable=False)
