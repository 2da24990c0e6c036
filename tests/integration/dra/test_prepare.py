"""The DRA kubelet plugin end to end: a fake kubelet registers it and prepares claims read
from a kmock API server; the emulator's GPUs, the CDI specs and the checkpoint show the result.
The protocol is kubernetes/kubelet@63b3249724f7d89a8aa48f9acb3811f193c9aa68:pkg/apis/dra/v1/api.proto;
CDI naming as NVIDIA/k8s-dra-driver-gpu@22407113785e78c7763b4637689a201eb39c6199:
cmd/gpu-kubelet-plugin/cdi.go."""

from __future__ import annotations

import json

import pytest

from nodeagent.dra.traces import claim_holders
from nodeagent.nvml import MigWriter, Placement
from nodeagent.state.snapshot import Holder
from tests.support.dra import DRIVER, NODE, DraNode, allocated_claim, mps_config
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet, FakeKubeletError


def _spec(node: DraNode, uid: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(
        (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid}.json").read_text()
    )
    return data


@pytest.mark.parametrize("speaks", [("v1.DRAPlugin",), ("v1beta1.DRAPlugin",)])
def test_a_1g_slice_is_created_prepared_and_destroyed(
    dra_node: DraNode, speaks: tuple[str, ...]
) -> None:
    kubelet = FakeDraKubelet(dra_node.root / "reg", speaks)
    assert kubelet.register(DRIVER) == speaks[0]
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"}))

    result = kubelet.prepare([claim])["uid-1"]

    assert result.error == ""
    (device,) = result.devices
    assert (device.requests, device.pool, device.device) == (
        ("gpu",),
        NODE,
        "gpu-0-mig-1g18gb-19-3",
    )
    assert device.cdi_ids == (f"k8s.{DRIVER}/claim=uid-1-gpu-0-mig-1g18gb-19-3",)
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    assert dra_node.layout(1) == []
    (mig,) = dra_node.inventory().gpus[0].slices
    spec = _spec(dra_node, "uid-1")
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    assert spec["devices"] == [
        {
            "name": "uid-1-gpu-0-mig-1g18gb-19-3",
            "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={mig.mig_uuid}"]},
        }
    ]
    assert claim_holders(dra_node.checkpoint)[str(mig.mig_uuid)].namespace == "speech"

    assert kubelet.prepare([claim])["uid-1"] == result  # idempotent: nothing more is made
    assert dra_node.layout(0) == [("1g.18gb", 3)]

    assert kubelet.unprepare([claim]) == {"uid-1": ""}
    assert dra_node.layout(0) == []
    assert not list(dra_node.cdi_dir.glob("*.json"))
    assert claim_holders(dra_node.checkpoint) == {}
    assert kubelet.unprepare([claim]) == {"uid-1": ""}  # an unknown claim is unprepared


def test_a_whole_gpu_changes_nothing_and_counts_as_held(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(allocated_claim("llm", "uid-w", {"gpu": "gpu-1"}))
    result = dra_node.kubelet.prepare([claim])["uid-w"]
    assert result.error == ""
    gpu = dra_node.inventory().gpus[1]
    assert not gpu.mig_current and gpu.slices == ()
    assert list(claim_holders(dra_node.checkpoint)) == [gpu.uuid]
    # A slice on that GPU overlaps the whole GPU's claim: refused, nothing changed.
    other = dra_node.add_claim(allocated_claim("asr", "uid-s", {"gpu": "gpu-1-mig-1g18gb-19-0"}))
    refused = dra_node.kubelet.prepare([other])["uid-s"]
    assert "claim speech/llm holds memory slices 0-0 of GPU 1" in refused.error
    assert not dra_node.inventory().gpus[1].mig_current


def test_mps_share_starts_a_daemon_with_the_claims_limits(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(
        allocated_claim("tts", "uid-m", {"gpu": "gpu-1"}, mps_config(25, "16Gi"))
    )
    result = dra_node.kubelet.prepare([claim])["uid-m"]
    assert result.error == ""
    env = _spec(dra_node, "uid-m")["devices"][0]["containerEdits"]["env"]  # type: ignore[index]
    pipe = dra_node.root / "p" / "mps" / "uid-m" / "gpu-1" / "pipe"
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M" in env
    assert (pipe / "control").exists()  # the daemon listens
    assert dra_node.kubelet.unprepare([claim]) == {"uid-m": ""}
    assert not (pipe / "control").exists()


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (mps_config(150), "threadPercentage must be a whole number 1-100, not 150"),
        (mps_config(25, "lots"), "pinnedMemory 'lots' is not a quantity of bytes"),
        (
            [{"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "x/v1", "kind": "Y"}}}],
            "must be apiVersion gpu.nodeagent.io/v1 kind MpsConfig",
        ),
    ],
)
def test_bad_config_is_refused_and_changes_nothing(
    dra_node: DraNode, config: list[dict[str, object]], error: str
) -> None:
    claim = dra_node.add_claim(allocated_claim("x", "uid-x", {"gpu": "gpu-1"}, config))
    result = dra_node.kubelet.prepare([claim])["uid-x"]
    assert error in result.error and result.error.startswith("claim speech/x: ")
    assert claim_holders(dra_node.checkpoint) == {}
    assert not list(dra_node.cdi_dir.glob("*.json"))


def test_mps_on_a_mig_slice_is_refused(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(
        allocated_claim("x", "uid-y", {"gpu": "gpu-0-mig-3g71gb-9-0"}, mps_config(50))
    )
    result = dra_node.kubelet.prepare([claim])["uid-y"]
    assert "an MPS share needs a whole GPU" in result.error
    assert dra_node.layout(0) == []


def test_a_busy_slice_is_never_touched(dra_node: DraNode) -> None:
    first = dra_node.add_claim(allocated_claim("a", "uid-a", {"gpu": "gpu-0-mig-1g35gb-15-0"}))
    assert dra_node.kubelet.prepare([first])["uid-a"].error == ""
    (mig,) = dra_node.inventory().gpus[0].slices
    dra_node.lib.attach(str(mig.mig_uuid), 4000, 1 << 30)
    # The claim goes while a process still runs on its slice: refused, the slice stays.
    error = dra_node.kubelet.unprepare([first])["uid-a"]
    assert "in use by pid 4000; nothing was changed" in error and dra_node.layout(0) == [
        ("1g.35gb", 0)
    ]
    dra_node.lib.detach(4000)
    assert dra_node.kubelet.unprepare([first]) == {"uid-a": ""}
    assert dra_node.layout(0) == []
    # A slice no claim made (the device-plugin path's), busy: a claim over it is refused.
    writer = MigWriter(dra_node.session)
    gi = writer.create_gpu_instance(0, 19, Placement(1, 1))
    writer.create_compute_instance(0, gi, 1, 0, full=True)
    (mig,) = dra_node.inventory().gpus[0].slices
    dra_node.lib.attach(str(mig.mig_uuid), 4002, 1 << 30)
    over = dra_node.add_claim(allocated_claim("c", "uid-c", {"gpu": "gpu-0-mig-2g35gb-14-0"}))
    refused = dra_node.kubelet.prepare([over])["uid-c"]
    assert "slice 1g.18gb at placement 1:1 is in use (process 4002)" in refused.error
    assert dra_node.layout(0) == [("1g.18gb", 1)]
    assert claim_holders(dra_node.checkpoint) == {}
    # Idle, it gives way to the claim's slice.
    dra_node.lib.detach(4002)
    assert dra_node.kubelet.prepare([over])["uid-c"].error == ""
    assert dra_node.layout(0) == [("2g.35gb", 0)]


def test_a_claim_that_is_gone_or_replaced_is_an_error(dra_node: DraNode) -> None:
    missing = dra_node.kubelet.prepare([Claim("speech", "nope", "uid-n")])["uid-n"]
    assert missing.error == "claim speech/nope does not exist"
    dra_node.add_claim(allocated_claim("asr", "uid-new", {"gpu": "gpu-1"}))
    stale = dra_node.kubelet.prepare([Claim("speech", "asr", "uid-old")])["uid-old"]
    assert "has UID 'uid-new', not uid-old" in stale.error


def test_registration_refuses_a_kubelet_without_a_common_version(dra_node: DraNode) -> None:
    kubelet = FakeDraKubelet(dra_node.root / "reg", ("v2.DRAPlugin",))
    with pytest.raises(FakeKubeletError, match="none of the versions"):
        kubelet.register(DRIVER)
    assert dra_node.server.registration.error.startswith("none of the versions")


def test_a_whole_gpu_turns_mig_off_only_when_its_slices_are_idle(dra_node: DraNode) -> None:
    writer = MigWriter(dra_node.session)
    writer.set_mig_mode(1, True)
    gi = writer.create_gpu_instance(1, 9, Placement(0, 4))
    writer.create_compute_instance(1, gi, 3, 0, full=True)
    (mig,) = dra_node.inventory().gpus[1].slices
    dra_node.lib.attach(str(mig.mig_uuid), 4100, 1 << 30)
    claim = dra_node.add_claim(allocated_claim("tts", "uid-t", {"gpu": "gpu-1"}, mps_config(50)))
    refused = dra_node.kubelet.prepare([claim])["uid-t"].error
    assert "GPU 1 slice 3g.71gb (GI 1, placement 0:4," in refused
    assert "is in use by pid 4100; nothing was changed" in refused
    assert dra_node.layout(1) == [("3g.71gb", 0)]
    dra_node.lib.detach(4100)
    assert dra_node.kubelet.prepare([claim])["uid-t"].error == ""
    gpu = dra_node.inventory().gpus[1]
    assert not gpu.mig_current and gpu.slices == ()
    assert dra_node.kubelet.unprepare([claim]) == {"uid-t": ""}


def test_unprepare_leaves_a_slice_a_device_plugin_pod_holds(dra_node: DraNode) -> None:
    """Both paths on one GPU (no dra.devices split): the device plugin handed the claim's
    slice to a pod whose process has not started; the claim going must not take it."""
    pods = dra_node.pods
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g35gb-15-2"}))
    assert dra_node.kubelet.prepare([claim])["uid-1"].error == ""
    (mig,) = dra_node.inventory().gpus[0].slices
    pods[str(mig.mig_uuid)] = Holder("speech", "other", "main")

    error = dra_node.kubelet.unprepare([claim])["uid-1"]

    assert "is in use by pod speech/other; nothing was changed" in error
    assert dra_node.layout(0) == [("1g.35gb", 2)]
    pods.clear()
    assert dra_node.kubelet.unprepare([claim]) == {"uid-1": ""}
    assert dra_node.layout(0) == []
