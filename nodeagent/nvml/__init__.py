"""The only package that calls NVML: typed reads into an Inventory, and MIG writes."""

from nodeagent.nvml.inventory import (
    Engines,
    GiProfile,
    Gpu,
    Inventory,
    Placement,
    Process,
    Slice,
)
from nodeagent.nvml.read import read_inventory
from nodeagent.nvml.session import NvmlSession, load_real_library, open_session
from nodeagent.nvml.write import MigModeResult, MigWriter

__all__ = [
    "Engines",
    "GiProfile",
    "Gpu",
    "Inventory",
    "MigModeResult",
    "MigWriter",
    "NvmlSession",
    "Placement",
    "Process",
    "Slice",
    "load_real_library",
    "open_session",
    "read_inventory",
]
