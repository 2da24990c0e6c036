"""A node running the DRA kubelet plugin on the emulator, a kmock API server holding its
ResourceSlices and ResourceClaims, and a fake kubelet that registers the plugin and calls it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.dra.k8s.server import KubeletPluginServer
from nodeagent.dra.node import NodeConfig, NodeDriver
from nodeagent.metrics.dra import DraStats
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.state.snapshot import Holder
from tests.support.cluster import Cluster
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet

kmock = pytest.importorskip("kmock")
CLAIMS = kmock.resource("resource.k8s.io/v1/resourceclaims")
DRIVER = "gpu.nodeagent.io"
NODE = "node-1"


class DraCluster(Cluster):
    """kmock's API server as the DRA driver sees it. `status_fault`, when set, answers the
    claims' status updates instead of storing them (a test's API server failing or hanging)."""

    status_fault: Callable[[], Any] | None = None


def dra_cluster() -> DraCluster:
    """A kmock API server that knows resource.k8s.io/v1 (an empty list, not a 404, before the
    first slice is written)."""
    cluster = DraCluster()

    def declare() -> None:
        cluster.km.resources["resource.k8s.io/v1/resourceslices"].kind = "ResourceSlice"
        cluster.km.resources["resource.k8s.io/v1/resourceslices"].namespaced = False
        cluster.km.resources["resource.k8s.io/v1/resourceclaims"].kind = "ResourceClaim"
        cluster.km.resources["resource.k8s.io/v1/resourceclaims"].namespaced = True

    def put_status(request: Any) -> Any:
        """An update of a claim's status (kmock serves PATCH, not PUT): stored whole."""
        if cluster.status_fault is not None:
            return cluster.status_fault()
        cluster.km.objects[CLAIMS, request.namespace, request.name] = dict(request.data)
        return dict(request.data)

    cluster.on_loop(declare)
    cluster.on_loop(lambda: cluster.km["put", CLAIMS] << put_status)
    return cluster


def dra_group(root: Path, **extra: Any) -> dict[str, Any]:
    """The dra settings of an agent whose kubelet plugin lives under `root` (its socket in p,
    the registration in reg, the CDI specs in cdi); `root` short: unix socket paths are."""
    return {
        "enabled": True,
        "plugin_dir": root / "p",
        "registry_dir": root / "reg",
        "cdi_dir": root / "cdi",
        **extra,
    }


def no_reset(index: int) -> None:
    raise AssertionError(f"GPU {index} was reset: Hopper changes MIG mode without one")


def allocated_claim(
    name: str, uid: str, devices: dict[str, str], config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it: `devices` maps request -> device name."""
    results = [
        {"request": r, "driver": DRIVER, "pool": NODE, "device": d} for r, d in devices.items()
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "speech", "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "gpu.nodeagent.io"}} for r in devices
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def mps_config(percentage: Any, pinned: Any = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsConfig"}
    params["threadPercentage"] = percentage
    if pinned is not None:
        params["pinnedMemory"] = pinned
    return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]


@dataclass
class DraNode:
    cluster: DraCluster
    lib: SimulatedNvml
    session: NvmlSession
    node: NodeDriver
    server: KubeletPluginServer
    kubelet: FakeDraKubelet
    root: Path
    state: Path
    pods: dict[str, Holder]  # devices the device plugin's pods hold (pod-resources)
    stats: DraStats | None = None  # what the driver counted (nodeagent.metrics.dra)

    def add_claim(self, claim: dict[str, Any]) -> Claim:
        meta = claim["metadata"]
        self.cluster.km.objects[CLAIMS, meta["namespace"], meta["name"]] = claim
        return Claim(meta["namespace"], meta["name"], meta["uid"])

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as the API server holds it now."""
        return dict(self.cluster.km.objects[CLAIMS, namespace, name])

    def inventory(self) -> Inventory:
        return read_inventory(self.session)

    def layout(self, gpu: int = 0) -> list[tuple[str, int]]:
        """GPU `gpu`'s slices as (profile, placement start), complete ones only."""
        g = self.inventory().gpus[gpu]
        return sorted((s.profile, s.placement.start) for s in g.slices if s.ci_id is not None)

    @property
    def checkpoint(self) -> Path:
        return self.node.config.checkpoint

    @property
    def cdi_dir(self) -> Path:
        return self.node.config.cdi_dir


def node_config(root: Path, mps_control: str = "nvidia-cuda-mps-control") -> NodeConfig:
    return NodeConfig(DRIVER, NODE, root / "p", root / "cdi", mps_control=mps_control)


def quit_mps(control: str, root: Path) -> None:
    """Quit the (fake) MPS daemon of `root` and wait until its control socket is gone (`quit`
    returns before the daemon has exited); leaves no daemon behind a failed test."""
    import os
    import subprocess
    import time

    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe")}
    env["CUDA_MPS_LOG_DIRECTORY"] = str(root / "log")
    socket = root / "pipe" / "control"
    if socket.exists():
        subprocess.run([control], input="quit\n", text=True, env=env, timeout=10, check=False)
        deadline = time.monotonic() + 10
        while socket.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
