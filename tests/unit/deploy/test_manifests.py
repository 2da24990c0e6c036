"""The DaemonSet manifests: RBAC is the least the agent needs, and the args are valid flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nodeagent.cli import build_parser
from nodeagent.settings import load

DEPLOY = Path(__file__).resolve().parents[3] / "daemonset"


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
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
        (("",), ("pods",), ("delete",)),  # its own role, only for --restart-pods
    ]
    assert not any("*" in part for rule in rules for items in rule for part in items)


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
    probes = {
        container["readinessProbe"]["httpGet"]["path"],
        container["livenessProbe"]["httpGet"]["path"],
    }
    assert probes == {"/readyz", "/healthz"}


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
