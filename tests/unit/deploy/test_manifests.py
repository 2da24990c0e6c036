"""The DaemonSet manifests: RBAC is the least the agent needs, and the args are valid flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nodeagent.cli.commands import build_parser
from nodeagent.settings import DEFAULT_PAUSE_COMPONENTS, load

DEPLOY = Path(__file__).resolve().parents[3] / "daemonset"
BASE = DEPLOY / "base"


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(BASE.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_rbac_is_minimal() -> None:
    rules = [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"]))
        for d in _docs()
        if d["kind"] == "ClusterRole"
        for r in d["rules"]
    ]
    assert rules == [
        (("",), ("nodes",), ("get", "list", "watch", "patch")),
        (("",), ("events",), ("create",)),
        (("",), ("pods",), ("list",)),
    ]  # no pod delete cluster-wide: a Role in each overlay's one namespace
    assert not any("*" in part for rule in rules for items in rule for part in items)
    # In the agent's namespace only: its NodeFeature object and its own pod.
    (role,) = [d for d in _docs() if d["kind"] == "Role"]
    assert [
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]
    ] == [
        (("nfd.k8s-sigs.io",), ("nodefeatures",), ("get", "create", "patch")),
        (("",), ("pods",), ("get",)),
    ]
    (binding,) = [d for d in _docs() if d["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert "namespace" not in role["metadata"]  # kustomize puts it in the agent's namespace


def test_daemonset_args_parse() -> None:
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    container = ds["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {"NODE_NAME": "node-1"}, None, args.groups)
    assert settings.kube.enabled and settings.mig.config_file == "/etc/nodeagent/mig.yaml"
    assert settings.kube.node_name == "node-1"
    # One label sink per deployment: the Node itself, not also an NFD file.
    assert settings.labels.nfd_features_file is None
    assert next(e["name"] for e in container["env"]) == "NODE_NAME"
    # The downward API gives the NodeFeature object its namespace and owner.
    downward = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert downward == {"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace",
                        "POD_NAME": "metadata.name", "POD_UID": "metadata.uid"}  # fmt: skip
    environ = {"NODE_NAME": "node-1", "POD_NAMESPACE": "nodeagent", "POD_NAME": "p", "POD_UID": "u",
               "NODEAGENT_NODE_FEATURE_API": "true"}  # fmt: skip
    on, _ = load(vars(args), environ, None, args.groups)
    assert on.kube.node_feature_api and on.kube.pod_namespace == "nodeagent"
    assert on.kube.pod_name == "p" and on.kube.pod_uid == "u"
    assert settings.kube.pause_components == {n: {} for n in DEFAULT_PAUSE_COMPONENTS}
    probes = {
        container["readinessProbe"]["httpGet"]["path"],
        container["livenessProbe"]["httpGet"]["path"],
    }
    assert probes == {"/readyz", "/healthz"}


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    files = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_mps_component_matches_the_device_plugin_layout() -> None:
    """The MPS component runs the agent in the device-plugin layout with the plugin's config,
    mounts <root>/shm (a tmpfs made by the init container) as /dev/shm, and is the only part
    with host PID/IPC."""
    component = DEPLOY / "components" / "mps"
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
    patch = yaml.safe_load((component / "daemonset-mps.yaml").read_text())["spec"]["template"]
    spec = patch["spec"]
    assert spec["hostPID"] and spec["hostIPC"]
    (base,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    assert "hostPID" not in base["spec"]["template"]["spec"]
    assert "hostIPC" not in base["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    args = build_parser().parse_args(init["args"])
    env = {e["name"]: e["value"] for e in init["env"]}
    settings, _ = load(vars(args), env, None, args.groups)
    assert args.mps_command == "mount-shm" and str(settings.mps.root) == "/run/nvidia/mps"
    (main,) = spec["containers"]
    env = {e["name"]: e["value"] for e in main["env"]}
    settings, _ = load({}, {**env, "NODE_NAME": "n", "NODEAGENT_KUBE": "1"}, None)
    assert settings.mps.enabled and settings.mps.layout == "device-plugin"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/run/nvidia/mps"]["mountPropagation"] == "Bidirectional"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]["name"]]["hostPath"]["path"] == "/run/nvidia/mps/shm"
    plugin_config = str(settings.mps.device_plugin_config)
    assert plugin_config.startswith(mounts["/etc/nvidia-device-plugin"]["mountPath"])


def test_overlays_use_the_base_without_a_cycle_and_rewrite_every_image() -> None:
    """An overlay inside its own base is a kustomize cycle; images are rewritten where the
    component's init container exists too."""
    root = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    overlay = yaml.safe_load((DEPLOY / "overlays" / "with-mps" / "kustomization.yaml").read_text())
    assert root["resources"] == ["base"] and overlay["resources"] == ["../../base"]
    assert overlay["components"] == ["../../components/nvidia-runtime", "../../components/mps"]
    assert root["images"] == overlay["images"] and root["images"][0]["name"] == "nodeagent"
    assert "images" not in yaml.safe_load((BASE / "kustomization.yaml").read_text())
    component = yaml.safe_load((DEPLOY / "components" / "mps" / "kustomization.yaml").read_text())
    for resource in component["resources"]:
        doc = yaml.safe_load((DEPLOY / "components" / "mps" / resource).read_text())
        assert doc["kind"] == "ConfigMap" and "config.yaml" in doc["data"]


def test_the_agent_container_runs_as_root_over_the_images_non_root_user() -> None:
    """The image's USER is 65532 (read-only commands need nothing more); the DaemonSet's agent
    writes MIG, runs the MPS daemon and reads the kubelet's root-owned socket."""
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    assert "\nUSER 65532:65532\n" in dockerfile
    (daemonset,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    context = container["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["privileged"]) == (0, 0, True)
