"""The only package that calls NVML: typed reads into an Inventory, and MIG writes.

The names below load with the module that defines them, when first used (PEP 562): importing
`nodeagent.nvml.codes` or `nodeagent.nvml.inventory` does not load the readers, the writers
or pynvml, so a command imports only what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nodeagent.nvml.inventory import (
        Engines as Engines,
    )
    from nodeagent.nvml.inventory import (
        GiProfile as GiProfile,
    )
    from nodeagent.nvml.inventory import (
        Gpu as Gpu,
    )
    from nodeagent.nvml.inventory import (
        Inventory as Inventory,
    )
    from nodeagent.nvml.inventory import (
        Placement as Placement,
    )
    from nodeagent.nvml.inventory import (
        Process as Process,
    )
    from nodeagent.nvml.inventory import (
        Slice as Slice,
    )
    from nodeagent.nvml.read import read_inventory as read_inventory
    from nodeagent.nvml.session import (
        NvmlSession as NvmlSession,
    )
    from nodeagent.nvml.session import (
        load_real_library as load_real_library,
    )
    from nodeagent.nvml.session import (
        open_session as open_session,
    )
    from nodeagent.nvml.write import MigModeResult as MigModeResult
    from nodeagent.nvml.write import MigWriter as MigWriter

_WHERE = {
    **dict.fromkeys(
        ("Engines", "GiProfile", "Gpu", "Inventory", "Placement", "Process", "Slice"), "inventory"
    ),
    "read_inventory": "read",
    **dict.fromkeys(("NvmlSession", "load_real_library", "open_session"), "session"),
    **dict.fromkeys(("MigModeResult", "MigWriter"), "write"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'nodeagent.nvml' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"nodeagent.nvml.{module}"), name)
    globals()[name] = value
    return value


__all__ = sorted(_WHERE)
