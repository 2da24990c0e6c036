"""GFD's labels of what the node is part of: the NVLink clique (`gpu.clique`, its IMEX
labeler) and the vGPU host (`vgpu.*`). Pure; keys without prefix, as in nodeagent.labels.gfd.

Learnt from NVIDIA/k8s-device-plugin `internal/lm/imex.go` and `internal/lm/vgpu.go`
(1b826acc), and go-nvlib's IsFabricAttached.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodeagent.nvml.inventory import Gpu, VgpuDevice


def clique_labels(gpus: Iterable[Gpu]) -> dict[str, str]:
    """`gpu.clique` = `<cluster UUID>.<clique id>` of the GPUs attached to a fabric (state
    completed, status success, a cluster UUID); none when no GPU is, or when they disagree on
    the cluster or the clique (GFD warns and publishes none)."""
    clusters, cliques = set(), set()
    for gpu in gpus:
        if gpu.fabric is not None and gpu.fabric.attached:
            clusters.add(gpu.fabric.cluster_uuid)
            cliques.add(gpu.fabric.clique_id)
    if len(clusters) != 1 or len(cliques) != 1:
        return {}
    return {"gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def vgpu_labels(vgpus: tuple[VgpuDevice, ...] | None) -> dict[str, str]:
    """`vgpu.present` (true where a GPU is a vGPU), and the host driver's version and branch
    (GFD's: the last vGPU's); none where the config space could not be read (None). A vGPU
    without the host-driver record makes GFD fail its whole run; here it only has no driver
    labels."""
    if vgpus is None:
        return {}
    labels = {"vgpu.present": "true" if vgpus else "false"}
    for device in vgpus:
        if device.host_driver_version is not None and device.host_driver_branch is not None:
            labels["vgpu.host-driver-version"] = device.host_driver_version
            labels["vgpu.host-driver-branch"] = device.host_driver_branch
    return labels
