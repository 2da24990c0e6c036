"""The monitoring component against a real Prometheus (Debian package `prometheus`) scraping two
emulated nodes over loopback, one with MIG slices under load and one with MPS: every dashboard
query parses and returns data, every rule evaluates without error and none fires on healthy
nodes; and promtool checks the rules and runs their unit tests.

Queries over the series still being added (health and pod attribution) may return nothing while
those series are not in the agent's exposition: the test asserts data for a query as soon as
every series it names is exposed."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.cli import stop_mps_daemon
from tests.support.metrics import http_get, prometheus_server, prometheus_tool, wait_for
from tests.support.mig_apply import reconfigure

MONITORING = Path(__file__).resolve().parents[3] / "daemonset" / "monitoring"
GIB = 1024**3
# Series announced for issue 15 (health counters, pod attribution): not exposed yet everywhere.
PENDING = {
    "nodeagent_gpu_temperature_celsius", "nodeagent_gpu_power_watts",
    "nodeagent_gpu_power_limit_watts", "nodeagent_gpu_energy_joules_total",
    "nodeagent_gpu_clock_hertz", "nodeagent_gpu_clock_throttle", "nodeagent_gpu_xid_errors_total",
    "nodeagent_gpu_last_xid", "nodeagent_gpu_ecc_errors_total", "nodeagent_gpu_row_remap_pending",
    "nodeagent_gpu_row_remap_failure", "nodeagent_gpu_pcie_replay_total",
    "nodeagent_slice_pod_info", "nodeagent_gpu_pod_info",
    # The MPS share claims: only with --dra (the monitored nodes run without it).
    *(f"nodeagent_dra_share_{m}" for m in (
        "sm_request_percent", "sm_limit_percent", "sm_achieved_percent", "memory_request_bytes",
        "memory_used_bytes", "held_below_request",
    )),
}  # fmt: skip
NOT_OURS = {"up", "kube_node_labels"}  # Prometheus' own, kube-state-metrics'
NAME = re.compile(r"\b(nodeagent_[a-z0-9_]+|up|kube_node_labels)\b(?!\s*\()")


def _query(base: str, promql: str) -> tuple[int, dict[str, Any]]:
    status, body = http_get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}), 10)
    return status, json.loads(body)


def _exposed(agent: Agent) -> set[str]:
    """The names of the samples the agent serves."""
    assert agent.server is not None
    status, body = http_get(f"http://127.0.0.1:{agent.server.port}/metrics", 10)
    assert status == 200
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in body.splitlines()
            if line and not line.startswith("#")}  # fmt: skip


def _mig_node() -> Agent:
    """Both H200s in all-balanced, a process with memory and load on a 3g and a 1g slice."""
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "generated")
    reconfigure(session, cfg, "all-balanced", lib.reset)
    inv = read_inventory(session)
    for n, (gpu, profile) in enumerate(((0, "3g.71gb"), (1, "1g.18gb"))):
        slice_ = next(s for s in inv.gpus[gpu].slices if s.profile == profile)
        lib.attach(slice_.mig_uuid or "", 700 + n, (n + 2) * GIB, 0.5)
    return make_agent(
        session, lib.reset, metrics={"refresh_interval_seconds": 0.2, "gpm_interval_seconds": 0.2}
    )


def _mps_node(tmp: Path, control: str) -> Agent:
    """Two H200s without MIG, both under an MPS daemon (fake control program) with 4 replicas."""
    lib = SimulatedNvml(parse_spec("h200x2"))
    lib.attach("0", 800, 3 * GIB, 0.3)
    mps = {"enabled": True, "replicas": 4, "pipe_dir": tmp / "pipe", "log_dir": tmp / "log",
           "ready_file": tmp / "ready", "control": control}  # fmt: skip
    return make_agent(
        NvmlSession(lib),
        lib.reset,
        mps=mps,
        metrics={"refresh_interval_seconds": 0.2, "gpm_interval_seconds": 0.2},
        labels={"nfd_features_file": tmp / "features"},
    )


@pytest.fixture
def monitored(
    tmp_path: Path, fake_mps_control: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Agent]]]:
    """Prometheus (with rules.yaml) scraping a MIG node and an MPS node, as the ServiceMonitor
    does: honor_labels, and the node, namespace, pod and container of the agent as target
    labels. Yields Prometheus' URL and the agents by node."""
    binary = prometheus_tool("prometheus")
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    agents = {"mig-node": _mig_node(), "mps-node": _mps_node(tmp_path, fake_mps_control)}
    started: list[Agent] = []
    try:
        for agent in agents.values():
            agent.start()
            started.append(agent)
        targets = "".join(
            f"      - targets: ['127.0.0.1:{agent.server.port}']\n"
            f"        labels: {{node: {node}, namespace: nodeagent, pod: nodeagent-{node},"
            " container: nodeagent}\n"
            for node, agent in agents.items()
            if agent.server is not None
        )
        config = (
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 250ms\n"
            "  evaluation_interval: 250ms\n"
            f"rule_files: ['{MONITORING / 'rules.yaml'}']\n"
            "scrape_configs:\n  - job_name: nodeagent\n    honor_labels: true\n"
            f"    static_configs:\n{targets}"
        )
        with prometheus_server(binary, tmp_path, config) as base:
            wait_for(lambda: http_get(base + "/-/ready", 10)[0] == 200, "Prometheus to be ready")
            # Enough scrapes of both nodes for rate() and increase() (two samples in the window).
            wait_for(
                lambda: len(_query(base, 'count_over_time(up{job="nodeagent"}[1m]) >= 4')[1]["data"]["result"]) == 2,
                "four scrapes of both agents",
            )  # fmt: skip
            yield base, agents
    finally:
        for agent in started:
            agent.stop()
        stop_mps_daemon(fake_mps_control, tmp_path / "pipe", tmp_path / "ready")


def _instantiate(expr: str, node: str) -> str:
    """What Grafana sends for one node and all GPUs."""
    return expr.replace("$node", node).replace("$gpu", ".*").replace("$__rate_interval", "1m")


def test_dashboard_and_rules_against_prometheus(monitored: tuple[str, dict[str, Agent]]) -> None:
    """One Prometheus for both checks (it takes seconds to start and scrape)."""
    every_dashboard_query_returns_data(*monitored)
    rules_evaluate_cleanly_and_stay_quiet_on_healthy_nodes(*monitored)


def every_dashboard_query_returns_data(base: str, agents: dict[str, Agent]) -> None:
    exposed = set().union(*(_exposed(a) for a in agents.values()))
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row"
               for t in p["targets"]]  # fmt: skip
    variables = [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    checked, waiting = 0, []
    for title, expr in queries:
        names = set(NAME.findall(expr))
        unknown = names - exposed - PENDING - NOT_OURS
        assert not unknown, f"{title}: {sorted(unknown)} is no series nodeagent exposes"
        results = []
        for node in agents:
            status, body = _query(base, _instantiate(expr, node))
            assert status == 200 and body["status"] == "success", (title, body)
            results += body["data"]["result"]
        if names & (PENDING - exposed):
            waiting.append(title)  # asserted once nodeagent exposes those series
            continue
        assert results, f"{title}: no data for {expr}"
        checked += 1
    assert checked >= 20, (checked, waiting)
    # The variables' queries: label_values(...) is Grafana's; the selector inside must match.
    for definition in variables:
        selector = re.fullmatch(r"label_values\((.+), (\w+)\)", definition)
        assert selector is not None, definition
        status, body = _query(base, _instantiate(selector.group(1), "mig-node"))
        assert status == 200 and body["data"]["result"], definition
        assert all(selector.group(2) in r["metric"] for r in body["data"]["result"])


def rules_evaluate_cleanly_and_stay_quiet_on_healthy_nodes(
    base: str, agents: dict[str, Agent]
) -> None:
    exposed = set().union(*(_exposed(a) for a in agents.values()))
    rules = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            unknown = set(NAME.findall(rule["expr"])) - exposed - PENDING - NOT_OURS
            assert not unknown, f"{rule['alert']}: {sorted(unknown)} is no series nodeagent exposes"

    def evaluated() -> list[dict[str, Any]]:
        status, body = http_get(base + "/api/v1/rules", 10)
        assert status == 200
        loaded = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        return loaded if all(r.get("lastEvaluation", "").startswith("2") and
                             r["evaluationTime"] > 0 for r in loaded) else []  # fmt: skip

    loaded = wait_for(evaluated, "every rule to be evaluated")
    assert len(loaded) == sum(len(g["rules"]) for g in rules["groups"])
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []
    assert [(r["name"], r["alerts"]) for r in loaded if r["alerts"]] == []


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = prometheus_tool("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(MONITORING / "rules.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout and "WARNING" not in check.stdout + check.stderr
    tests = sorted(str(p.relative_to(MONITORING)) for p in (MONITORING / "tests").glob("*.yaml"))
    assert tests
    run = subprocess.run(
        [promtool, "test", "rules", *tests],
        cwd=MONITORING, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("SUCCESS") == len(tests)
