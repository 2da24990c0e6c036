"""The NVML emulator: an object that stands in for the `pynvml` module.

It has pynvml's function names and signatures (the ctypes array + count-by-reference list
calls included), returns pynvml's ctypes structures and raises pynvml's `NVMLError_*`
classes, so `nodeagent.nvml` runs on it unchanged. It enforces what the hardware enforces
(see DESIGN.md, "The emulator"). The calls live in one mixin per area.
"""

from __future__ import annotations

from nodeagent.sim.actions import UserActions
from nodeagent.sim.devices import DeviceCalls
from nodeagent.sim.fieldcalls import FieldCalls
from nodeagent.sim.gpmcalls import GpmCalls
from nodeagent.sim.healthcalls import HealthCalls
from nodeagent.sim.instances import InstanceCalls
from nodeagent.sim.platform import PlatformCalls
from nodeagent.sim.utilizationcalls import UtilizationCalls


class SimulatedNvml(
    DeviceCalls,
    InstanceCalls,
    GpmCalls,
    HealthCalls,
    FieldCalls,
    UtilizationCalls,
    PlatformCalls,
    UserActions,
):
    """A drop-in for the pynvml module over emulated GPUs (see the module docstring)."""
