"""A node reboot: MIG slices, MIG mode (Hopper), /var/run/cdi and the MPS daemons are gone,
the checkpoint in /var/lib/kubelet is not, and the kubelet prepares its pods' claims again. A
claim the checkpoint calls prepared is made again (its slice, spec, daemon), not answered from
the checkpoint with CDI ids that name nothing (NVIDIA/k8s-dra-driver-gpu@22407113785e:
cmd/gpu-kubelet-plugin/device_state.go drops a checkpoint of another boot)."""

from __future__ import annotations

import json

from nodeagent.dra.checkpoint import load
from nodeagent.nvml import MigWriter, Placement
from tests.integration.dra.test_prepare import _spec
from tests.support.dra import DraNode, allocated_claim, mps_config, quit_mps


def _reboot(node: DraNode) -> None:
    """What a reboot leaves: no slice, MIG off, no CDI spec, no MPS daemon."""
    writer = MigWriter(node.session)
    for gpu in node.inventory().gpus:
        for s in gpu.slices:
            if s.ci_id is not None:
                writer.destroy_compute_instance(gpu.index, s.gi_id, s.ci_id)
            writer.destroy_gpu_instance(gpu.index, s.gi_id)
        if gpu.mig_current:
            writer.set_mig_mode(gpu.index, False)
    for spec in node.cdi_dir.glob("*.json"):
        spec.unlink()


def test_a_prepared_claims_slice_is_made_again_after_a_reboot(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"}))
    first = dra_node.kubelet.prepare([claim])["uid-1"]
    assert first.error == ""
    _reboot(dra_node)

    again = dra_node.kubelet.prepare([claim])["uid-1"]

    assert again == first  # the same CDI ids
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    (mig,) = dra_node.inventory().gpus[0].slices
    env = _spec(dra_node, "uid-1")["devices"][0]["containerEdits"]["env"]  # type: ignore[index]
    assert env == [f"NVIDIA_VISIBLE_DEVICES={mig.mig_uuid}"]  # the new slice's UUID
    (device,) = load(dra_node.checkpoint).claims["uid-1"].devices
    assert (device.mig_uuid, device.existed) == (mig.mig_uuid, False)
    assert dra_node.kubelet.unprepare([claim]) == {"uid-1": ""}
    assert dra_node.layout(0) == []  # this claim made it: it goes with the claim


def test_a_slice_that_was_there_before_the_claim_is_the_claims_after_a_reboot(
    dra_node: DraNode,
) -> None:
    writer = MigWriter(dra_node.session)
    writer.set_mig_mode(0, True)
    gi = writer.create_gpu_instance(0, 9, Placement(4, 4))  # made by hand, before any claim
    writer.create_compute_instance(0, gi, 3, 0, full=True)
    claim = dra_node.add_claim(allocated_claim("b", "uid-b", {"gpu": "gpu-0-mig-3g71gb-9-4"}))
    assert dra_node.kubelet.prepare([claim])["uid-b"].error == ""
    assert load(dra_node.checkpoint).claims["uid-b"].devices[0].existed
    _reboot(dra_node)

    assert dra_node.kubelet.prepare([claim])["uid-b"].error == ""

    assert dra_node.layout(0) == [("3g.71gb", 4)]
    assert not load(dra_node.checkpoint).claims["uid-b"].devices[0].existed
    assert dra_node.kubelet.unprepare([claim]) == {"uid-b": ""}
    assert dra_node.layout(0) == []


def test_an_mps_share_gets_its_daemon_again(dra_node: DraNode, fake_mps_control: str) -> None:
    claim = dra_node.add_claim(allocated_claim("tts", "uid-m", {"gpu": "gpu-1"}, mps_config(25)))
    assert dra_node.kubelet.prepare([claim])["uid-m"].error == ""
    pipe = dra_node.root / "p" / "mps" / "uid-m" / "gpu-1" / "pipe"
    quit_mps(fake_mps_control, pipe.parent)  # the daemon died with the node
    assert not (pipe / "control").exists()
    spec_before = json.dumps(_spec(dra_node, "uid-m"))

    assert dra_node.kubelet.prepare([claim])["uid-m"].error == ""

    assert (pipe / "control").exists()  # the daemon listens again
    assert json.dumps(_spec(dra_node, "uid-m")) == spec_before
    assert dra_node.kubelet.unprepare([claim]) == {"uid-m": ""}
