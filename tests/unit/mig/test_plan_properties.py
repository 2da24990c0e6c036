"""Hypothesis: for random layouts, in-use sets and desired counts, the plan is valid,
reaches the counts when reachable, never touches an in-use slice, and is minimal
(compared with an independent brute-force search)."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import SliceInUse
from nodeagent.mig.plan import plan_gpu
from tests.support.mig import (
    Candidate,
    all_valid_layouts,
    blank_gpu,
    brute_force_cost,
    candidates,
    counts_of,
    desired,
    gpu_with,
    reference_valid,
)

MODELS = ["h200", "a100-40gb", "a30"]


@cache
def layouts(model: str) -> list[frozenset[Candidate]]:
    return all_valid_layouts(blank_gpu(model))


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, list[Candidate], set[int], dict[int, int]]:
    model = draw(st.sampled_from(MODELS))
    gpu = blank_gpu(model)
    order = draw(st.permutations(candidates(gpu)))
    current: list[Candidate] = []
    limit = draw(st.integers(0, 8))
    for cand in order:
        if len(current) < limit and reference_valid(gpu, [*current, cand]):
            current.append(cand)
    busy = set(draw(st.sets(st.integers(0, max(len(current) - 1, 0)), max_size=3))) & set(
        range(len(current))
    )
    target = draw(st.sampled_from(layouts(model)))
    return model, current, busy, counts_of(target)


def _simulate(current: list[Candidate], ops: list[dict[str, object]]) -> set[Candidate]:
    """Apply the plan's GI operations to the set of placed instances."""
    placed = set(current)
    for op in ops:
        place = op.get("placement")
        assert isinstance(place, dict)
        key = (op["profile_id"], place["start"], place["size"])
        if op["op"] == "destroy-gi":
            placed.remove(key)  # type: ignore[arg-type]
        elif op["op"] == "create-gi":
            assert key not in placed
            placed.add(key)  # type: ignore[arg-type]
    return placed


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_plan_is_valid_safe_and_minimal(
    case: tuple[str, list[Candidate], set[int], dict[int, int]],
) -> None:
    model, current, busy, want = case
    gpu = gpu_with(model, current, busy)
    best = brute_force_cost(layouts(model), current, busy, want)
    if best is None:
        with pytest.raises(SliceInUse) as err:
            plan_gpu(gpu, desired(want))
        assert "in use by pid" in str(err.value)
        return
    result = plan_gpu(gpu, desired(want))
    ops = [{**op.to_dict(), "profile_id": op.profile_id} for op in result.operations]
    assert len(ops) == best, (current, busy, want, ops)
    final = _simulate(current, ops)
    assert reference_valid(gpu, sorted(final))
    assert counts_of(sorted(final)) == want
    busy_gis = {s.gi_id for s in gpu.slices if s.in_use}
    assert not any(op.gi_id in busy_gis for op in result.operations)
    kinds = [op.op for op in result.operations]
    assert kinds == sorted(kinds, key=["destroy-ci", "destroy-gi", "create-gi", "create-ci"].index)
