"""A claim with admin access (resource.k8s.io/v1 DeviceRequestAllocationResult.adminAccess: a
monitoring pod, allocated a device other claims may hold) sees the GPU as it is: nothing is
made, destroyed or held for it, and another claim's slice is not in its way (NVIDIA's driver
leaves admin-access devices out of its overlap check: NVIDIA/k8s-dra-driver-gpu@22407113785e:
cmd/gpu-kubelet-plugin/device_state.go, requestedNonAdminDevices)."""

from __future__ import annotations

from typing import Any

from nodeagent.dra.traces import claim_holders
from nodeagent.nvml import MigWriter, Placement
from tests.integration.dra.test_prepare import _spec
from tests.support.dra import DraNode, allocated_claim


def _admin(name: str, uid: str, device: str) -> dict[str, Any]:
    claim = allocated_claim(name, uid, {"gpu": device})
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return claim


def test_admin_access_to_another_claims_slice_changes_and_holds_nothing(
    dra_node: DraNode,
) -> None:
    owner = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-3g71gb-9-0"}))
    assert dra_node.kubelet.prepare([owner])["uid-1"].error == ""
    (mig,) = dra_node.inventory().gpus[0].slices
    admin = dra_node.add_claim(_admin("watch", "uid-a", "gpu-0-mig-3g71gb-9-0"))

    assert dra_node.kubelet.prepare([admin])["uid-a"].error == ""

    env = _spec(dra_node, "uid-a")["devices"][0]["containerEdits"]["env"]  # type: ignore[index]
    assert env == [f"NVIDIA_VISIBLE_DEVICES={mig.mig_uuid}"]
    assert {h.pod for h in claim_holders(dra_node.checkpoint).values()} == {"asr"}
    assert dra_node.kubelet.unprepare([admin]) == {"uid-a": ""}
    assert dra_node.layout(0) == [("3g.71gb", 0)]  # the owner's slice stays
    assert dra_node.kubelet.unprepare([owner]) == {"uid-1": ""}
    assert dra_node.layout(0) == []


def test_admin_access_to_a_whole_gpu_leaves_its_slices(dra_node: DraNode) -> None:
    writer = MigWriter(dra_node.session)
    writer.set_mig_mode(1, True)
    gi = writer.create_gpu_instance(1, 9, Placement(4, 4))
    writer.create_compute_instance(1, gi, 3, 0, full=True)
    admin = dra_node.add_claim(_admin("watch", "uid-a", "gpu-1"))

    assert dra_node.kubelet.prepare([admin])["uid-a"].error == ""

    assert dra_node.inventory().gpus[1].mig_current  # an ordinary claim would turn MIG off
    assert dra_node.layout(1) == [("3g.71gb", 4)]
    assert claim_holders(dra_node.checkpoint) == {}
    assert dra_node.kubelet.unprepare([admin]) == {"uid-a": ""}
    assert dra_node.layout(1) == [("3g.71gb", 4)]


def test_admin_access_to_a_slice_that_is_not_there_is_refused(dra_node: DraNode) -> None:
    admin = dra_node.add_claim(_admin("watch", "uid-a", "gpu-0-mig-1g18gb-19-5"))
    error = dra_node.kubelet.prepare([admin])["uid-a"].error
    assert "admin access to a MIG slice GPU 0 does not have" in error
    assert dra_node.layout(0) == [] and not dra_node.inventory().gpus[0].mig_current
