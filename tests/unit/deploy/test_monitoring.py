"""The monitoring component: the PrometheusRule is rules.yaml, every alert is labelled, named
and unit-tested both ways, the dashboard is templated on node and GPU, and the scrape keeps the
node and the pods' own labels."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_kustomize import kubectl

DEPLOY = Path(__file__).resolve().parents[3] / "daemonset"
MONITORING = DEPLOY / "monitoring"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _load(MONITORING / "rules.yaml")["groups"] for r in g["rules"]]


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MONITORING / "dashboard.json").read_text())
    return data


def _targets() -> list[tuple[str, dict[str, Any]]]:
    return [
        (p["title"], t) for p in _dashboard()["panels"] if p["type"] != "row" for t in p["targets"]
    ]


def test_prometheusrule_is_generated_from_rules_yaml() -> None:
    rule = _load(MONITORING / "prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == _load(MONITORING / "rules.yaml")
    spec = importlib.util.spec_from_file_location("generate", MONITORING / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.main(["--check"]) == 0  # byte for byte what generate.py writes
    assert generate.render("groups: []\n").endswith("spec:\n  groups: []\n")


def test_component_resources() -> None:
    component = _load(MONITORING / "kustomization.yaml")
    assert component["kind"] == "Component"
    assert component["resources"] == [
        "servicemonitor.yaml",
        "prometheusrule.yaml",
        "networkpolicy.yaml",
    ]
    (generator,) = component["configMapGenerator"]
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    assert generator["files"] == ["nodeagent.json=dashboard.json"]
    overlay = _load(DEPLOY / "overlays" / "with-monitoring" / "kustomization.yaml")
    root = _load(DEPLOY / "kustomization.yaml")
    assert overlay["resources"] == ["../../base"] and overlay["components"] == ["../../monitoring"]
    assert overlay["images"] == root["images"]


def test_the_network_policy_admits_only_prometheus_to_the_agents_metrics_port() -> None:
    policy = _load(MONITORING / "networkpolicy.yaml")
    daemonset = _load(DEPLOY / "base" / "daemonset.yaml")
    pod = daemonset["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"namespaceSelector", "podSelector"}  # both: Prometheus's pods only
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}] and "metrics" in ports
    assert not pod["spec"].get("hostNetwork"), "on the node's network no policy applies"


def test_every_alert_is_labelled_and_names_node_gpu_and_slice() -> None:
    alerts = _alerts()
    assert len({a["alert"] for a in alerts}) == len(alerts) >= 12
    for alert in alerts:
        name, expr = alert["alert"], alert["expr"]
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        text = alert["annotations"]["summary"] + alert["annotations"]["description"]
        assert set(alert["annotations"]) == {"summary", "description"}, name
        assert "$labels.node" in alert["annotations"]["summary"], name
        if re.search(r"nodeagent_(gpu|slice)_", expr):
            assert "$labels.gpu" in text, name
        if "nodeagent_slice_" in expr:
            assert all(f"$labels.{k}" in text for k in ("gi_id", "ci_id", "profile")), name


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in sorted((MONITORING / "tests").glob("*.yaml")):
        suite = _load(path)
        assert suite["rule_files"] == ["../rules.yaml"]
        for case in suite["tests"]:
            for check in case["alert_rule_test"]:
                (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert fired == names
    assert quiet == names


def test_reset_xids_are_those_the_agent_holds_for_a_reset_or_reboot() -> None:
    """The alert's XIDs are the catalog's that the agent keeps tainted until a reset or a
    reboot (nodeagent/state/xid_recovery.tsv), and 154 (the driver's recovery action changed);
    application XIDs (ignored by NVIDIA's device plugin too) never alert."""
    from nodeagent.state.recovery import REBOOT, RESET, xids_waiting_for

    by_name = {a["alert"]: a["expr"] for a in _alerts()}
    reset = set(
        re.findall(r'xid=~"([\d|]+)"', by_name["NodeagentGpuXidResetRequired"])[0].split("|")
    )
    waiting = {*xids_waiting_for(RESET), *xids_waiting_for(REBOOT), 154}
    assert reset == {str(x) for x in waiting}
    others = set(re.findall(r'xid!~"([\d|]+)"', by_name["NodeagentGpuXid"])[0].split("|"))
    assert others == reset | {"13", "31", "43", "45", "68"}


def test_dashboard_is_templated_on_node_and_gpu() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "node", "gpu"}
    assert variables["gpu"]["multi"] and variables["gpu"]["includeAll"]
    assert "$node" in variables["gpu"]["definition"]
    targets = _targets()
    assert len(targets) >= 30
    for title, target in targets:
        assert target["datasource"]["uid"] == "${datasource}", title
        assert 'node="$node"' in target["expr"], title
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Slices by profile and placement", "Which pod holds which slice",
                   "Sharing per GPU", "MPS limits", "Temperature", "Clock throttle reasons",
                   "XID errors (1h)", "ECC errors (1h)"):  # fmt: skip
        assert wanted in titles


def test_servicemonitor_keeps_pod_labels_and_names_the_node() -> None:
    monitor = _load(MONITORING / "servicemonitor.yaml")
    service = _load(DEPLOY / "base" / "service.yaml")
    daemonset = _load(DEPLOY / "base" / "daemonset.yaml")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True  # the attribution series' namespace/pod/container
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
            "action": "replace"} in endpoint["relabelings"]  # fmt: skip
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"] and port["targetPort"] == "metrics"
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": port["port"]} in container["ports"]
    assert service["spec"]["selector"] == daemonset["spec"]["template"]["metadata"]["labels"]


def test_kustomize_builds_the_overlay() -> None:
    out = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "overlays" / "with-monitoring")],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    rule = by_kind[("PrometheusRule", "nodeagent")]
    assert rule["metadata"]["namespace"] == "nodeagent"
    assert rule["spec"] == _load(MONITORING / "rules.yaml")
    dashboard = by_kind[("ConfigMap", "nodeagent-grafana-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["nodeagent.json"]) == _dashboard()
    assert ("ServiceMonitor", "nodeagent") in by_kind and ("DaemonSet", "nodeagent") in by_kind
