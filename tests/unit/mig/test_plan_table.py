"""Table-driven plan tests: known transitions and refusals on the emulated models."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.base.errors import SliceInUse
from nodeagent.mig.geometry import Geometry
from nodeagent.mig.plan import mismatches, plan, plan_gpu
from nodeagent.nvml import Inventory
from tests.support.mig import desired, gpu_with

# H200 profile ids (read off the real card): 1g.18gb=19, 1g.18gb+me=20, 1g.35gb=15,
# 2g.35gb=14, 3g.71gb=9, 4g.71gb=5, 7g.141gb=0.
BALANCED_H200 = [(14, 0, 2), (19, 2, 1), (19, 3, 1), (9, 4, 4)]


def _ops(gpu_plan: object) -> list[tuple[str, str | None, int | None]]:
    return [
        (op.op, op.profile, op.placement.start if op.placement else None)
        for op in gpu_plan.operations  # type: ignore[attr-defined]
    ]


def test_balanced_to_all_1g_keeps_the_two_1g_slices() -> None:
    gpu = gpu_with("h200", BALANCED_H200)
    result = plan_gpu(gpu, desired({19: 7}))
    ops = _ops(result)
    assert ("destroy-gi", "2g.35gb", 0) in ops and ("destroy-gi", "3g.71gb", 4) in ops
    assert sorted(start for op, _, start in ops if op == "create-gi") == [0, 1, 4, 5, 6]
    assert result.kept == (2, 3)
    assert len(ops) == 2 * 2 + 5 * 2  # vs 4*2 + 7*2 = 22 for a full teardown


def test_in_use_slice_is_kept_and_others_placed_around_it() -> None:
    gpu = gpu_with("h200", [(19, 3, 1)], busy={0})
    result = plan_gpu(gpu, desired({19: 7}))
    assert all(op.gi_id != 1 for op in result.operations)
    assert sorted(s for op, _, s in _ops(result) if op == "create-gi") == [0, 1, 2, 4, 5, 6]


def test_in_use_slice_that_blocks_is_named_and_nothing_planned() -> None:
    gpu = gpu_with("h200", BALANCED_H200, busy={3})
    with pytest.raises(SliceInUse) as err:
        plan_gpu(gpu, desired({19: 7}))
    msg = str(err.value)
    assert "GPU 0" in msg and "3g.71gb" in msg and "MIG-3" in msg and "pid 1003" in msg
    assert "nothing was changed" in msg


def test_in_use_slice_elsewhere_does_not_block() -> None:
    # 1g.18gb at 2 in use: all-balanced is still reachable around it (2g@0, 1g@3, 3g@4).
    gpu = gpu_with("h200", [(19, 2, 1)], busy={0})
    result = plan_gpu(gpu, desired({19: 2, 14: 1, 9: 1}))
    assert [op for op, _, _ in _ops(result)].count("create-gi") == 3


def test_disable_with_a_slice_in_use_is_refused() -> None:
    gpu = gpu_with("h200", BALANCED_H200, busy={1})
    with pytest.raises(SliceInUse, match="cannot disable MIG on GPU 0"):
        plan_gpu(gpu, desired({}, enabled=False))


def test_disable_destroys_cis_then_gis_then_mode() -> None:
    gpu = gpu_with("h200", BALANCED_H200)
    kinds = [op.op for op in plan_gpu(gpu, desired({}, enabled=False)).operations]
    assert kinds == ["destroy-ci"] * 4 + ["destroy-gi"] * 4 + ["set-mig-mode"]


def test_matching_gpu_is_untouched() -> None:
    gpu = gpu_with("h200", BALANCED_H200)
    assert plan_gpu(gpu, desired({19: 2, 14: 1, 9: 1})).operations == ()


def test_gi_left_without_its_ci_is_finished_not_rebuilt() -> None:
    gpu = gpu_with("h200", BALANCED_H200)
    slices = list(gpu.slices)
    slices[3] = replace(slices[3], ci_id=None, mig_uuid=None)
    result = plan_gpu(replace(gpu, slices=tuple(slices)), desired({19: 2, 14: 1, 9: 1}))
    assert [(op.op, op.gi_id) for op in result.operations] == [("create-ci", 4)]


def test_gi_with_an_extra_ci_loses_it_and_stays() -> None:
    gpu = gpu_with("h200", [(9, 0, 4)])
    extra = replace(gpu.slices[0], ci_id=1, mig_uuid="MIG-extra")
    gpu = replace(gpu, slices=(*gpu.slices, extra))
    ops = plan_gpu(gpu, desired({9: 1})).operations
    assert [(op.op, op.ci_id) for op in ops] == [("destroy-ci", 1)]


def test_pending_disable_is_cancelled() -> None:
    gpu = replace(gpu_with("a100-40gb", [(19, 0, 1)]), mig_pending=False)
    ops = _ops(plan_gpu(gpu, desired({19: 1})))
    assert ops == [("set-mig-mode", None, None)]


def test_mig_off_gpu_is_enabled_then_filled() -> None:
    gpu = replace(gpu_with("a30", []), mig_current=False, mig_pending=False)
    kinds = [op.op for op in plan_gpu(gpu, desired({14: 2, 5: 1})).operations]
    assert kinds == ["set-mig-mode"] + ["create-gi"] * 3 + ["create-ci"] * 3


def test_pod_allocations_count_as_in_use() -> None:
    gpu = gpu_with("h200", BALANCED_H200)
    with pytest.raises(SliceInUse, match="pod default/asr-0"):
        plan_gpu(gpu, desired({19: 7}), in_use={"MIG-3": "pod default/asr-0"})


def test_only_covered_gpus_are_planned() -> None:
    a, b = gpu_with("h200", BALANCED_H200), gpu_with("h200", [])
    inv = Inventory("580", 13000, (a, replace(b, index=1)))
    result = plan(inv, {1: replace(desired({0: 1}), gpu=1)})
    assert {op.gpu for op in result.operations} == {1}
    assert mismatches(inv, {0: desired({19: 2, 14: 1, 9: 1})}) == []
    assert mismatches(inv, {0: desired({19: 7})}) == [
        "GPU 0: has 2x1g.18gb + 1x2g.35gb + 1x3g.71gb, wanted 7x1g.18gb"
    ]


@pytest.mark.parametrize(
    ("model", "profile", "most"),
    [
        ("h200", 19, 7),
        ("h200", 15, 4),
        ("h200", 14, 3),
        ("h200", 9, 2),
        ("h200", 20, 1),
        ("a30", 14, 4),
        ("a30", 5, 2),
        ("a100-40gb", 15, 4),
        ("h100-80gb", 0, 1),
    ],
)
def test_max_count(model: str, profile: int, most: int) -> None:
    gpu = gpu_with(model, [])
    geometry = Geometry.of(gpu)
    assert geometry.max_count(geometry.profile(profile)) == most
