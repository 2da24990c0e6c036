"""MIG writes through nodeagent.nvml, and each refusal the emulator must give as hardware does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.nvml.codes import IN_USE, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_SUPPORTED
from nodeagent.sim.models import MIB

RESET_REQUIRED = 16


@pytest.fixture
def h200(make_session: Callable[..., NvmlSession]) -> tuple[NvmlSession, MigWriter]:
    session = make_session("h200")
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    return session, writer


def test_create_and_destroy_round_trip(h200: tuple[NvmlSession, MigWriter]) -> None:
    session, w = h200
    gi = w.create_gpu_instance(0, 5, Placement(0, 4))
    ci = w.create_compute_instance(0, gi, 4)
    assert [(s.profile, s.ci_id) for s in read_inventory(session).gpus[0].slices] == [
        ("4g.71gb", ci)
    ]
    w.destroy_compute_instance(0, gi, ci)
    w.destroy_gpu_instance(0, gi)
    assert read_inventory(session).gpus[0].slices == ()


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        ([(9, 0, 4)], (19, 2, 1)),  # 1g inside a 3g
        ([(14, 2, 2)], (9, 0, 4)),  # 3g over a 2g
        ([(0, 0, 8)], (19, 7 - 1, 1)),  # anything beside a 7g
        ([(15, 6, 2)], (9, 4, 4)),  # 3g@4 over 1g.35gb@6
    ],
)
def test_overlap_is_insufficient_resources(
    h200: tuple[NvmlSession, MigWriter],
    existing: list[tuple[int, int, int]],
    new: tuple[int, int, int],
) -> None:
    _, w = h200
    for pid, start, size in existing:
        w.create_gpu_instance(0, pid, Placement(start, size))
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, new[0], Placement(new[1], new[2]))
    assert err.value.code == INSUFFICIENT_RESOURCES
    assert "GPU 0" in str(err.value)


def test_capacity_is_insufficient_resources(h200: tuple[NvmlSession, MigWriter]) -> None:
    _, w = h200
    w.create_gpu_instance(0, 20, Placement(0, 1))  # 1g.18gb+me: one per GPU
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, 20, Placement(1, 1))
    assert err.value.code == INSUFFICIENT_RESOURCES


def test_placement_not_offered_is_invalid(h200: tuple[NvmlSession, MigWriter]) -> None:
    _, w = h200
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, 14, Placement(6, 2))  # plain 2g never starts at 6
    assert err.value.code == INVALID_ARGUMENT


def test_unknown_profile_is_not_supported(h200: tuple[NvmlSession, MigWriter]) -> None:
    _, w = h200
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, 42, Placement(0, 1))
    assert err.value.code == NOT_SUPPORTED


def test_destroy_gi_with_ci_is_in_use(h200: tuple[NvmlSession, MigWriter]) -> None:
    _, w = h200
    gi = w.create_gpu_instance(0, 19, Placement(0, 1))
    w.create_compute_instance(0, gi, 1)
    with pytest.raises(NvmlError) as err:
        w.destroy_gpu_instance(0, gi)
    assert err.value.code == IN_USE


def test_destroy_ci_with_process_is_in_use(h200: tuple[NvmlSession, MigWriter]) -> None:
    session, w = h200
    gi = w.create_gpu_instance(0, 19, Placement(0, 1))
    ci = w.create_compute_instance(0, gi, 1)
    uuid = read_inventory(session).gpus[0].slices[0].mig_uuid
    assert uuid
    session.lib.attach(uuid, 1001, 100 * MIB)
    with pytest.raises(NvmlError) as err:
        w.destroy_compute_instance(0, gi, ci)
    assert err.value.code == IN_USE
    session.lib.detach(1001)
    w.destroy_compute_instance(0, gi, ci)


def test_mig_calls_with_mig_off_are_not_supported(
    make_session: Callable[..., NvmlSession],
) -> None:
    w = MigWriter(make_session("h200"))
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, 19, Placement(0, 1))
    assert err.value.code == NOT_SUPPORTED


def test_hopper_mode_change_is_immediate(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("h100-80gb")
    result = MigWriter(session).set_mig_mode(0, True)
    assert (result.current, result.pending, result.activation_status) == (True, True, 0)
    assert read_inventory(session).gpus[0].mig_current


def test_hopper_mode_change_with_processes_stays_pending(
    make_session: Callable[..., NvmlSession],
) -> None:
    session = make_session("h200")
    session.lib.attach("0", 5, 10 * MIB)
    result = MigWriter(session).set_mig_mode(0, True)
    assert (result.current, result.pending) == (False, True)
    assert result.activation_status == IN_USE


def test_ampere_mode_change_pending_until_reset(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("a100-40gbx2")
    w = MigWriter(session)
    result = w.set_mig_mode(1, True)
    assert (result.current, result.pending) == (False, True)
    assert result.is_pending and result.activation_status == RESET_REQUIRED
    gpu = read_inventory(session).gpus[1]
    assert (gpu.mig_current, gpu.mig_pending) == (False, True)
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(1, 19, Placement(0, 1))
    assert err.value.code == NOT_SUPPORTED
    session.lib.reset(1)
    inv = read_inventory(session)
    assert inv.gpus[1].mig_current and not inv.gpus[0].mig_current  # only that GPU
    w.create_gpu_instance(1, 19, Placement(0, 1))


def test_disabling_mig_with_instances_is_in_use(h200: tuple[NvmlSession, MigWriter]) -> None:
    _, w = h200
    w.create_gpu_instance(0, 19, Placement(0, 1))
    with pytest.raises(NvmlError) as err:
        w.set_mig_mode(0, False)
    assert err.value.code == IN_USE


def test_a30_has_four_memory_slices(make_session: Callable[..., NvmlSession]) -> None:
    session = make_session("a30")
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    session.lib.reset(0)
    for start in (0, 2):
        gi = w.create_gpu_instance(0, 5, Placement(start, 2))
        w.create_compute_instance(0, gi, 2)
    with pytest.raises(NvmlError) as err:
        w.create_gpu_instance(0, 14, Placement(3, 1))
    assert err.value.code == INSUFFICIENT_RESOURCES
    gpu = read_inventory(session).gpus[0]
    assert gpu.memory_slice_count == 4 and len(gpu.slices) == 2


def test_creation_order_matters_without_placement(
    make_session: Callable[..., NvmlSession],
) -> None:
    """Why nodeagent always passes a placement: first-fit 1g then 3g leaves no room for 4g."""
    session = make_session("h200")
    MigWriter(session).set_mig_mode(0, True)
    lib = session.lib
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlDeviceCreateGpuInstance(dev, 19)  # lands at 0
    lib.nvmlDeviceCreateGpuInstance(dev, 9)  # lands at 4
    with pytest.raises(lib.NVMLError_InsufficientResources):
        lib.nvmlDeviceCreateGpuInstance(dev, 9)
