"""The MIG configs generated from the real GPUs (what the agent and `mig apply` use without a
config file, as mig-manager since v0.14.0) are those of the emulator's model, and plan on the
real inventory. Read-only: plans, never applies.

Run on the GPU machine: `python -m pytest -m gpu tests/gpu/test_generated_real.py`.
"""

from __future__ import annotations

import pytest

from nodeagent.mig.generate import GeneratedConfigs, generate_configs
from nodeagent.mig.plan import plan
from nodeagent.mig.select import resolve
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from tests.gpu.test_real_nvml import MODEL_BY_NAME

pytestmark = pytest.mark.gpu


def test_generated_configs_match_the_emulated_model_and_plan(real_inventory: Inventory) -> None:
    keys = [MODEL_BY_NAME.get(g.name) for g in real_inventory.gpus]
    if None in keys or not keys:
        pytest.skip(f"no emulator model for {[g.name for g in real_inventory.gpus]}")
    emulated = read_inventory(NvmlSession(SimulatedNvml([k for k in keys if k])))
    real = generate_configs(real_inventory)
    assert real == generate_configs(emulated)
    print(sorted(real))
    configs = GeneratedConfigs().load(real_inventory)
    for name in ("all-balanced", "all-disabled", *sorted(n for n in real if n[4].isdigit())):
        desired = resolve(configs, name, real_inventory)
        the_plan = plan(real_inventory, desired)  # pure: nothing is changed
        print(name, len(the_plan.operations), "operations")
