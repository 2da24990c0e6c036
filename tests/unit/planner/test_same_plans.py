"""The planner's caches change no plan: every plan of a table of nodes and demand mixes equals,
field by field, the plan the planner made before it cached anything per GPU kind
(tests/golden/plans.json, written by the planner of commit 5f5407c) over benchmarks/planner.py's
mixes. A plan the old planner could not search exactly (marked not exact) may only get better.
The branch and bound search (nodeagent.planner.branch) finds the same plans: the first best one
in the order of the old dynamic programme.

Regenerate (only when a plan is meant to change, and say why in the commit):
    .venv/bin/python -m tests.unit.planner.test_same_plans
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.nvml import Gpu, Inventory
from nodeagent.planner.planner import plan_node
from nodeagent.planner.workloads import Workload
from tests.support.mig import blank_gpu, gpu_with

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "plans.json"


def _bench_mixes() -> dict[str, list[Workload]]:
    """The demand mixes of benchmarks/planner.py (up to ten kinds of workloads)."""
    spec = importlib.util.spec_from_file_location(
        "planner_bench", ROOT / "benchmarks" / "planner.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.MIXES  # type: ignore[no-any-return]


MIXES = _bench_mixes()


def fresh(model: str) -> Gpu:
    return dataclasses.replace(blank_gpu(model), mig_current=False, mig_pending=False)


def node(*gpus: Gpu) -> Inventory:
    return Inventory(
        "580.0", 13000, tuple(dataclasses.replace(g, index=i) for i, g in enumerate(gpus))
    )


def nodes() -> dict[str, Inventory]:
    """8 fresh GPUs of one model; a mixed node; GPUs with existing slices, some in use."""
    split = gpu_with("h200", [(9, 0, 4), (14, 4, 2), (19, 6, 1), (19, 7, 1)], busy={2})
    idle = gpu_with("h200", [(9, 0, 4), (9, 4, 4)])
    return {
        "h200x8": node(*[fresh("h200")] * 8),
        "h100-80gbx8": node(*[fresh("h100-80gb")] * 8),
        "a100-40gbx8": node(*[fresh("a100-40gb")] * 8),
        "mixed": node(*[fresh("a100-40gb")] * 2, *[fresh("h100-80gb")] * 2, fresh("a30")),
        "h200-slices": node(split, split, idle, idle, *[fresh("h200")] * 4),
    }


def plan_json(inventory: Inventory, workloads: list[Workload]) -> Any:
    """The whole plan as JSON values (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(plan_node(inventory, workloads))))


CASES = [(n, m) for n in nodes() for m in MIXES]


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())  # type: ignore[no-any-return]


def _key(plan: Any) -> tuple[list[int], int, int, int]:
    o = plan["objective"]
    return (o["placed"], -o["gpus_used"], -o["stranded_mib"], o["kept"])


@pytest.mark.parametrize(("node_name", "mix"), CASES)
def test_the_plan_is_the_one_made_before_the_caches(
    golden: dict[str, Any], node_name: str, mix: str
) -> None:
    before = golden[f"{node_name} / {mix}"]
    now = plan_json(nodes()[node_name], MIXES[mix])
    if before["exact"]:
        assert now == before
    else:  # the old search ran out of budget: never worse (a greedy plan among equals may
        # differ: which client counts finish their search decides which greedy plans compete)
        assert _key(now) >= _key(before)


if __name__ == "__main__":
    plans = {f"{n} / {m}": plan_json(nodes()[n], MIXES[m]) for n, m in CASES}
    GOLDEN.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    print(f"{len(plans)} plans written to {GOLDEN}")
