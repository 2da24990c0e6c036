"""A real Kubernetes v1.36 control plane for the tests (../shared/k8s: kube-apiserver,
kube-scheduler, kube-controller-manager and etcd on 127.0.0.1; no kubelet), started by its own
up.sh and stopped by its down.sh."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEVICE_CLASSES = REPO / "daemonset" / "components" / "dra" / "deviceclasses.yaml"
# Beside the checkout; NODEAGENT_K8S_DIR names it for a worktree elsewhere (../wt/<name>).
K8S = Path(os.environ.get("NODEAGENT_K8S_DIR") or REPO.parent / "shared" / "k8s")
PORTS = {  # up.sh's variables and their defaults
    "K8S_ETCD_PORT": 23790,
    "K8S_ETCD_PEER_PORT": 23800,
    "K8S_API_PORT": 16443,
    "K8S_KCM_PORT": 17257,
    "K8S_SCHED_PORT": 17259,
}
# up.sh's default gates (every DRA gate of v1.36 that is beta, but DRADeviceTaintRules)
DEFAULT_GATES = (
    "DRAPartitionableDevices=true,DRADeviceTaints=true,DRAResourceClaimDeviceStatus=true,"
    "DRADeviceBindingConditions=true,DRAExtendedResource=true,DRAConsumableCapacity=true,"
    "DRASchedulerFilterTimeout=true,DRAResourceClaimGranularStatusAuthorization=true"
)


@dataclass(frozen=True)
class ControlPlane:
    kubeconfig: Path
    state: Path


def k8s_available() -> bool:
    return (K8S / "up.sh").is_file()


def required() -> bool:
    """Where the control plane must be there (CI): a missing one fails instead of skipping."""
    return bool(os.environ.get("CI") or os.environ.get("NODEAGENT_REQUIRE_K8S"))


def start_control_plane(state: Path, gates: str | None = None, port_base: int = 0) -> ControlPlane:
    """Start one in `state` (its certificates, etcd data, logs, pids); every port moved by
    `port_base`. Raises RuntimeError with the end of up.sh's output when it fails."""
    env = {**os.environ, "K8S_STATE": str(state)}
    env.update({name: str(port + port_base) for name, port in PORTS.items()})
    if gates is not None:
        env["K8S_FEATURE_GATES"] = gates
    proc = subprocess.run(
        ["bash", str(K8S / "up.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        subprocess.run(["bash", str(K8S / "down.sh"), str(state)], capture_output=True, timeout=60)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"the control plane did not start (up.sh exit {proc.returncode}):\n{tail}"
        )
    return ControlPlane(state / "admin.kubeconfig", state)


def stop_control_plane(cp: ControlPlane) -> None:
    subprocess.run(
        ["bash", str(K8S / "down.sh"), "--wipe", str(cp.state)], capture_output=True, timeout=120
    )


# -- one control plane for the whole suite, shared by the xdist workers ----------------------


def shared_dir(run: str) -> Path:
    """Where the suite's control plane lives: one per test session (`run`: the session's
    marker, the same in the controller and every worker)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"nodeagent-k8s-{run[:16]}"


def port_base(run: str) -> int:
    """Ports of their own for each session (two suites on one machine do not collide)."""
    import hashlib

    return 1000 + int(hashlib.sha256(run.encode()).hexdigest(), 16) % 40 * 100


def shared_control_plane(
    run: str, gates: str | None = None, offset: int = 0, name: str = "plane"
) -> ControlPlane:
    """The session's control plane `name` (`gates`: its feature gates, None up.sh's; `offset`:
    added to the session's ports, apart for each plane), started by the first test process
    that asks (under a file lock); the others find it, so xdist workers that run tests of one
    module share it instead of starting two on the same ports. Raises RuntimeError when it
    could not start (said once: every later asker gets the same error)."""
    import fcntl
    import json

    d = shared_dir(run)
    d.mkdir(exist_ok=True)
    with open(d / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = d / f"{name}.json"
        if info.exists():
            data = json.loads(info.read_text())
            if data.get("error"):
                raise RuntimeError(data["error"])
            return ControlPlane(Path(data["kubeconfig"]), Path(data["state"]))
        state = d / ("state" if name == "plane" else f"state-{name}")
        try:
            cp = start_control_plane(state, gates, port_base(run) + offset)
        except RuntimeError as err:
            info.write_text(json.dumps({"error": str(err)}))
            raise
        info.write_text(json.dumps({"kubeconfig": str(cp.kubeconfig), "state": str(cp.state)}))
        return cp


def stop_shared(run: str) -> None:
    """Stop the session's control planes, if any was started (the session's end)."""
    import shutil

    d = shared_dir(run)
    for state in sorted(d.glob("state*")) if d.is_dir() else []:
        if state.is_dir():
            stop_control_plane(ControlPlane(state / "admin.kubeconfig", state))
    shutil.rmtree(d, ignore_errors=True)


def make_node(api_client: Any, name: str, labels: dict[str, str] | None = None) -> None:
    """A Node a pod can be bound to (no kubelet: allocatable given, the not-ready taint gone)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    core.create_node(
        {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}
    )
    status = {
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "250"},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Test", "message": "no kubelet"}
            ],
        }
    }
    core.patch_node_status(name, status)
    core.patch_node(name, {"spec": {"taints": []}})


def claim_pod(name: str, node: str) -> dict[str, Any]:
    """A pause pod named `name` on `node` whose container uses the ResourceClaim `name`
    (its request "g")."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "g", "resourceClaimName": name}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "g"}]}}],
        },
    }  # fmt: skip


def create_device_classes(api_client: Any) -> None:
    """The DeviceClasses nodeagent ships (daemonset/components/dra/deviceclasses.yaml), as
    `kubectl apply` would create them; one that exists already (another test made it) stays."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    resource = client.ResourceV1Api(api_client)
    for doc in yaml.safe_load_all(DEVICE_CLASSES.read_text()):
        if not doc or doc.get("kind") != "DeviceClass":
            continue
        try:
            resource.create_device_class(doc)
        except ApiException as err:
            if err.status != 409:
                raise
