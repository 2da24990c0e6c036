"""A fleet of agents against a real API server (issue 31 item 8): what each agent asks of it,
at steady state and during a `nvidia.com/mig.config` rollout across all nodes, extrapolated to
5,000 nodes against the API server's default in-flight limits.

N agents (default 20), each its own process on its own emulated node (`--simulate h200`, a
state file each), run `nodeagent run --kube --dra` against kube-apiserver v1.36.2 from
../shared/k8s (started here, stopped at the end). Each agent counts the requests it sends
(`nodeagent_kube_requests_total{verb,resource,code}`, scraped from its /metrics); the phases:

    start     from launch until every node carries the agent's labels (and its ResourceSlices)
    steady    STEADY seconds doing nothing (default 120)
    rollout   nvidia.com/mig.config=all-1g.18gb on every node, until each reports success
    churn     ROUNDS rounds of one DRA claim a node (a 1g.18gb slice): a pod and its claim
              created, the real scheduler allocates, the tests' fake kubelet has the node's
              agent prepare and unprepare it, pod and claim deleted

Run from the repository root in the project's .venv:

    python benchmarks/fleet.py [--agents 20] [--steady 120] [--plot benchmarks/fleet.png]

Prints requests per agent per minute by phase, verb and resource, the writes at steady state
(should be none), and the extrapolation; writes a plot where matplotlib is importable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet  # noqa: E402
from tests.support.k8s import (  # noqa: E402
    create_device_classes,
    k8s_available,
    make_node,
    start_control_plane,
    stop_control_plane,
)

MIG_CONFIG = "nvidia.com/mig.config"
DRIVER = "gpu.nodeagent.io"
SLICE_CLASS = "mig-1g.18gb.gpu.nodeagent.io"
STATE = "nvidia.com/mig.config.state"
# kube-apiserver defaults (v1.36): --max-requests-inflight 400, --max-mutating-requests-inflight
# 200 (with API Priority and Fairness these are the server's total concurrency, 600 seats).
# Watches are long-running requests: they hold no in-flight seat after they start.
MAX_READONLY_INFLIGHT = 400
MAX_MUTATING_INFLIGHT = 200
WRITES = ("create", "patch", "update", "delete")
SERIES = re.compile(
    r'^nodeagent_kube_requests_total\{code="([^"]*)",resource="([^"]*)",verb="([^"]*)"\} (\S+)$'
)

Counts = Counter[tuple[str, str]]  # (verb, resource) -> requests


def scrape_counts(port: int) -> Counts:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts: Counts = Counter()
    for line in text.splitlines():
        m = SERIES.match(line)
        if m:
            counts[(m.group(3), m.group(2))] += int(float(m.group(4)))
    return counts


class Agent:
    def __init__(self, index: int, root: Path, kubeconfig: Path) -> None:
        self.node = f"fleet-{index:03d}"
        d = root / self.node
        self.registry = d / "registry"
        for sub in ("plugins", "registry", "cdi"):
            (d / sub).mkdir(parents=True)
        argv = [
            sys.executable, "-m", "nodeagent", "--simulate", "h200", "--sim-state", str(d / "node.json"),
            "run", "--metrics-address", "127.0.0.1:0", "--kube", "--kubeconfig", str(kubeconfig),
            "--pod-resources-socket", "", "--dra", "--dra-plugin-dir", str(d / "plugins"),
            "--dra-registry-dir", str(d / "registry"), "--dra-cdi-dir", str(d / "cdi"),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        self.log = (d / "agent.log").open("w+")
        self.proc = subprocess.Popen(
            argv, env={**env, "NODE_NAME": self.node}, stderr=self.log, cwd=REPO, text=True
        )
        self.port = 0

    def wait_port(self, deadline: float) -> None:
        while time.monotonic() < deadline and not self.port:
            self.log.seek(0)
            m = re.search(r"metrics on port (\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"agent {self.node} exited: {self.log.read()[-2000:]}")
            else:
                time.sleep(0.2)
        if not self.port:
            raise SystemExit(f"agent {self.node} did not serve its metrics")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def churn(api_client: Any, agents: list[Agent], rounds: int) -> int:
    """`rounds` times, one claim a node: created with a pod, allocated by the scheduler,
    prepared and unprepared through the node's agent (the fake kubelet), deleted. Returns the
    number of claims."""
    from kubernetes import client

    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    create_device_classes(api_client)
    core.create_namespace({"metadata": {"name": "fleet"}})
    kubelets = {}
    for a in agents:
        kubelets[a.node] = FakeDraKubelet(a.registry)
        kubelets[a.node].register(DRIVER)
    done = 0
    for r in range(rounds):
        for a in agents:
            name = f"{a.node}-{r}"
            resource.create_namespaced_resource_claim("fleet", {
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": SLICE_CLASS}}]}},
            })  # fmt: skip
            core.create_namespaced_pod("fleet", {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": a.node},
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                },
            })  # fmt: skip
        deadline = time.monotonic() + 120
        pending = {a.node for a in agents}
        while pending and time.monotonic() < deadline:
            for a in agents:
                if a.node not in pending:
                    continue
                claim = resource.read_namespaced_resource_claim(f"{a.node}-{r}", "fleet")
                if claim.status and claim.status.allocation:
                    ref = Claim("fleet", claim.metadata.name, claim.metadata.uid)
                    result = kubelets[a.node].prepare([ref])[ref.uid]
                    if result.error:
                        raise SystemExit(f"prepare on {a.node}: {result.error}")
                    error = kubelets[a.node].unprepare([ref])[ref.uid]
                    if error:
                        raise SystemExit(f"unprepare on {a.node}: {error}")
                    core.delete_namespaced_pod(claim.metadata.name, "fleet", grace_period_seconds=0)
                    resource.delete_namespaced_resource_claim(claim.metadata.name, "fleet")
                    pending.discard(a.node)
                    done += 1
            time.sleep(0.2)
        if pending:
            raise SystemExit(f"claims not allocated in time on {sorted(pending)}")
    return done


def fleet_counts(agents: list[Agent]) -> list[Counts]:
    return [scrape_counts(a.port) for a in agents]


def delta(after: list[Counts], before: list[Counts]) -> Counts:
    total: Counts = Counter()
    for a, b in zip(after, before, strict=True):
        total.update({k: a[k] - b.get(k, 0) for k in a})
    return +total


def wait_all(core: Any, nodes: list[str], done: Any, what: str, timeout: float) -> float:
    """Seconds until `done(node object)` holds for every node."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if all(done(core.read_node(n)) for n in nodes):
            return time.monotonic() - start
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def per_agent_minute(counts: Counts, agents: int, seconds: float) -> dict[str, float]:
    by: dict[str, float] = {}
    for (verb, resource), n in sorted(counts.items()):
        by[f"{verb} {resource}"] = n / agents / (seconds / 60)
    return by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--steady", type=float, default=120.0, help="seconds of steady state")
    parser.add_argument("--rounds", type=int, default=3, help="claim churn: claims a node")
    parser.add_argument("--plot", default=str(HERE / "fleet.png"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not k8s_available():
        raise SystemExit("../shared/k8s is not beside this checkout: no control plane to run")
    # A SIGTERM stops the agents and the control plane too (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from kubernetes import client, config

    with tempfile.TemporaryDirectory(prefix="nodeagent-fleet-") as tmp:
        root = Path(tmp)
        print(f"starting the control plane ({root / 'k8s'}) ...", flush=True)
        cp = start_control_plane(root / "k8s", port_base=4300)
        agents: list[Agent] = []
        try:
            configuration = client.Configuration()
            config.load_kube_config(str(cp.kubeconfig), client_configuration=configuration)
            api_client = client.ApiClient(configuration)
            core = client.CoreV1Api(api_client)
            for i in range(args.agents):
                make_node(api_client, f"fleet-{i:03d}")  # schedulable: allocatable, no taint
            print(f"starting {args.agents} agents ...", flush=True)
            t0 = time.monotonic()
            agents = [Agent(i, root / "agents", cp.kubeconfig) for i in range(args.agents)]
            for a in agents:
                a.wait_port(time.monotonic() + 120)
            nodes = [a.node for a in agents]
            wait_all(
                core, nodes,
                lambda n: "nvidia.com/gpu.product" in (n.metadata.labels or {}),
                "every node's labels", 300,
            )  # fmt: skip
            start_seconds = time.monotonic() - t0
            time.sleep(5)  # the first ResourceSlices and gate probes settle
            phases: dict[str, tuple[Counts, float]] = {}
            before = fleet_counts(agents)
            phases["start"] = (delta(before, [Counter() for _ in agents]), start_seconds + 5)
            print(f"steady state for {args.steady:.0f} s ...", flush=True)
            time.sleep(args.steady)
            after = fleet_counts(agents)
            phases["steady"] = (delta(after, before), args.steady)
            print("rollout: mig.config=all-1g.18gb on every node ...", flush=True)
            t1 = time.monotonic()
            for n in nodes:
                core.patch_node(n, {"metadata": {"labels": {MIG_CONFIG: "all-1g.18gb"}}})
            wait_all(
                core, nodes,
                lambda n: (n.metadata.labels or {}).get(STATE) == "success",
                "every node's success", 600,
            )  # fmt: skip
            rollout_seconds = time.monotonic() - t1
            rolled = fleet_counts(agents)
            phases["rollout"] = (delta(rolled, after), rollout_seconds)
            print(f"churn: {args.rounds} rounds of one claim a node ...", flush=True)
            t2 = time.monotonic()
            claims = churn(api_client, agents, args.rounds)
            churned = fleet_counts(agents)
            phases["churn"] = (delta(churned, rolled), time.monotonic() - t2)
            print(f"  {claims} claims prepared and unprepared", flush=True)
        finally:
            for a in agents:
                a.stop()
            stop_control_plane(cp)
    report(args, phases)


def report(args: argparse.Namespace, phases: dict[str, tuple[Counts, float]]) -> None:
    n = args.agents
    print(f"\n{n} agents (emulated H200, run --kube --dra), requests per agent per minute")
    rows: dict[str, dict[str, float]] = {}
    for phase, (counts, seconds) in phases.items():
        rows[phase] = per_agent_minute(counts, n, seconds)
        total = sum(counts.values()) / n / (seconds / 60)
        writes = sum(v for (verb, _), v in counts.items() if verb in WRITES) / n / (seconds / 60)
        print(f"\n{phase}: {seconds:.0f} s, {total:.2f} requests/agent/min ({writes:.2f} writes)")
        for key, rate in rows[phase].items():
            print(f"  {key:<34}{rate:>10.3f}")
    steady_counts, steady_seconds = phases["steady"]
    steady_writes = sum(v for (verb, _), v in steady_counts.items() if verb in WRITES)
    print(f"\nwrites at steady state, all {n} agents, {steady_seconds:.0f} s: {steady_writes}")
    # Little's law: in flight = rate x time in the server; watches hold no seat once started.
    print("\nat 5,000 nodes (rate x 5,000; in flight = rate x latency, 50 ms a request assumed):")
    extrapolated: dict[str, dict[str, float]] = {}
    for phase in ("start", "steady"):
        counts, seconds = phases[phase]
        reads = sum(v for (verb, _), v in counts.items() if verb not in WRITES and verb != "watch")
        writes = sum(v for (verb, _), v in counts.items() if verb in WRITES)
        watches = sum(v for (verb, _), v in counts.items() if verb == "watch")
        per_s = {
            k: v / n / seconds * 5000
            for k, v in (("reads", reads), ("writes", writes), ("watches", watches))
        }
        inflight_reads, inflight_writes = per_s["reads"] * 0.05, per_s["writes"] * 0.05
        extrapolated[phase] = {
            **per_s,
            "inflight_reads": inflight_reads,
            "inflight_writes": inflight_writes,
        }
        print(
            f"  {phase:<8} {per_s['reads']:8.1f} reads/s ({inflight_reads:5.1f} of {MAX_READONLY_INFLIGHT} in flight)"
            f"  {per_s['writes']:8.1f} writes/s ({inflight_writes:5.1f} of {MAX_MUTATING_INFLIGHT})"
            f"  {per_s['watches']:7.1f} watches opened/s"
        )
    # A rollout is a burst, not a rate: what one node's change costs, times 5,000 labelled at once,
    # and the time the API server needs for it at its in-flight limits (50 ms a request).
    counts, seconds = phases["rollout"]
    reads = sum(v for (verb, _), v in counts.items() if verb not in WRITES) / n
    writes = sum(v for (verb, _), v in counts.items() if verb in WRITES) / n
    busy = max(
        reads * 5000 * 0.05 / MAX_READONLY_INFLIGHT, writes * 5000 * 0.05 / MAX_MUTATING_INFLIGHT
    )
    extrapolated["rollout"] = {
        "reads_per_node": reads,
        "writes_per_node": writes,
        "seconds_at_limits": busy,
        "inflight_reads": min(reads * 5000, MAX_READONLY_INFLIGHT),
        "inflight_writes": min(writes * 5000, MAX_MUTATING_INFLIGHT),
    }
    print(
        f"  rollout  {reads:.1f} reads and {writes:.1f} writes a node ({seconds:.0f} s for all {n});"
        f" 5,000 nodes at once: {reads * 5000:,.0f} reads, {writes * 5000:,.0f} writes, which the"
        f" API server's limits admit in {busy:.1f} s"
    )
    if "churn" in phases:
        counts, seconds = phases["churn"]
        claims = n * args.rounds
        per_claim = sum(counts.values()) / claims
        writes = sum(v for (verb, _), v in counts.items() if verb in WRITES) / claims
        extrapolated["churn"] = {
            "requests_per_claim": per_claim,
            "writes_per_claim": writes,
            "inflight_reads": (per_claim - writes) * claims / seconds * 5000 / n * 0.05,
            "inflight_writes": writes * claims / seconds * 5000 / n * 0.05,
        }
        print(
            f"  churn    {per_claim:.1f} requests a claim ({writes:.1f} writes); at this pace on"
            f" 5,000 nodes: {extrapolated['churn']['inflight_reads']:.1f} reads and"
            f" {extrapolated['churn']['inflight_writes']:.1f} writes in flight"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"per_agent_minute": rows, "at_5000": extrapolated}, indent=1)
        )
    per_node = {
        f"{phase} ({seconds:.0f} s)": {f"{v} {r}": c / n for (v, r), c in sorted(counts.items())}
        for phase, (counts, seconds) in phases.items()
    }
    plot(per_node, extrapolated, args.plot, n)


def plot(
    rows: dict[str, dict[str, float]], at5000: dict[str, dict[str, float]], path: str, n: int
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed; {path} not written)")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    phases = list(rows)
    keys = sorted({k for r in rows.values() for k in r})
    bottom = [0.0] * len(phases)
    for key in keys:
        values = [rows[p].get(key, 0.0) for p in phases]
        left.bar(phases, values, bottom=bottom, label=key)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set_ylabel("requests a node sent in the phase")
    left.set_title(f"{n} agents against kube-apiserver v1.36.2")
    left.legend(fontsize=7)
    names = list(at5000)
    x = range(len(names))
    right.bar(
        [i - 0.2 for i in x],
        [at5000[p]["inflight_reads"] for p in names],
        0.4,
        label="reads in flight",
    )
    right.bar(
        [i + 0.2 for i in x],
        [at5000[p]["inflight_writes"] for p in names],
        0.4,
        label="writes in flight",
    )
    right.axhline(MAX_MUTATING_INFLIGHT, color="red", linestyle="--", label="mutating limit (200)")
    right.axhline(
        MAX_READONLY_INFLIGHT, color="black", linestyle=":", label="read-only limit (400)"
    )
    right.set_xticks(list(x), [p if p != "rollout" else "rollout (all at once)" for p in names])
    right.set_yscale("symlog", linthresh=1)
    right.set_ylabel("requests in flight at 5,000 nodes (50 ms each)")
    right.set_title("extrapolated to 5,000 nodes")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
