"""The NVML emulator: a stand-in for the pynvml module over emulated GPUs."""

from pathlib import Path

from nodeagent.sim.faults import Fault, FaultPlan
from nodeagent.sim.latency import latency_from_env
from nodeagent.sim.library import SimulatedNvml
from nodeagent.sim.models import MODEL_NAMES, load_model, parse_spec


def open_emulator(spec: str, state_path: Path | None = None) -> SimulatedNvml:
    """The emulator for a simulate SPEC, with state kept in `state_path` when given.

    Faults from NODEAGENT_SIM_FAULTS apply, and NVML write times from NODEAGENT_SIM_LATENCY
    (none when unset). Raises SimError for a bad spec, fault rule, latency or state file.
    """
    latency = latency_from_env()
    lib = SimulatedNvml(parse_spec(spec), state_path, FaultPlan.from_env())
    lib.latency = latency
    return lib


__all__ = [
    "MODEL_NAMES",
    "Fault",
    "FaultPlan",
    "SimulatedNvml",
    "load_model",
    "open_emulator",
    "parse_spec",
]
