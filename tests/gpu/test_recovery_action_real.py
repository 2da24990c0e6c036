"""The driver's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) read on a real GPU
through nodeagent's NVML layer, as the DRA driver's fault poll reads it. Read-only: nothing is
reset, nothing is set. Skips where the driver (before R565) or the GPU does not report it."""

from __future__ import annotations

import pytest

from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.fields import RECOVERY_ACTION, read_recovery_action
from nodeagent.nvml.health import mig_handle, read_fault_counters
from nodeagent.nvml.session import gpu_handle
from nodeagent.state.recovery import ACTIONS, NONE, action_kind

pytestmark = pytest.mark.gpu


def test_the_recovery_action_reads_as_a_known_action(session: NvmlSession) -> None:
    driver = session.call("nvmlSystemGetDriverVersion")
    found = {}
    for gpu in read_inventory(session).gpus:
        unsupported: set[tuple[object, ...]] = set()
        value = read_recovery_action(session, gpu_handle(session, gpu.index), unsupported)
        print(f"driver {driver} GPU {gpu.index} {gpu.name}: recovery action {value}")
        if value is None:
            # Not supported is remembered, so the poll does not ask again.
            assert unsupported == {("nvmlDeviceGetFieldValues", RECOVERY_ACTION)}
            continue
        assert value == NONE or value in ACTIONS, f"an action unknown to nodeagent: {value}"
        found[gpu.index] = value
    if not found:
        pytest.skip(f"driver {driver} reports no GPU recovery action (it came with R565)")
    busy = {i: action_kind(v) for i, v in found.items() if v != NONE}
    print(f"GPUs that ask for a recovery action: {busy or 'none'}")


def test_the_fault_poll_carries_it(session: NvmlSession) -> None:
    """read_fault_counters, as HealthSampler.poll_faults calls it: the same value, and a MIG
    device (where MIG is already on; it is never turned on here) answers without failing."""
    for gpu in read_inventory(session).gpus:
        handle = gpu_handle(session, gpu.index)
        direct = read_recovery_action(session, handle)
        polled = read_fault_counters(session, handle).recovery_action
        if direct is None:
            assert polled is None
            continue
        assert polled is not None and (polled == NONE or polled in ACTIONS)
        for s in gpu.slices:
            mig = mig_handle(session, s.mig_uuid) if s.mig_uuid else None
            if mig is not None:
                h = read_fault_counters(session, mig)
                print(f"GPU {gpu.index} GI {s.gi_id}: recovery action {h.recovery_action}")
