"""What one node's agent asks of the API server when kube-apiserver comes back from an outage
(issue 39, class 2), and how long a claim made during the outage waits to be prepared.

A control plane of its own (../shared/k8s, Kubernetes v1.36.2: started here, stopped at the
end), a Node (no kubelet), and `nodeagent run --kube --dra` in this process on an emulated
2 x H200 (binding conditions on: the agent's binding watcher makes a claim's MIG slice before
its pod binds). Once the agent is idle, kube-apiserver is stopped (SIGTERM, by the pid up.sh
wrote) for `--outage` seconds and started again (up.sh starts what is not running); the moment
its /readyz answers `ok` is the recovery. A claim for a 1g.18gb slice and its pod are created
then, before the agent is back; its latency runs from the recovery to the fake kubelet's
NodePrepareResources answering, which it calls as soon as the pod is bound.

Printed: the agent's requests in the first minute after the recovery, by verb and resource and
in all (its own nodeagent_kube_requests_total), and the claim's seconds to bound and to
prepared. Run from the repository root in the project's .venv:

    python benchmarks/recovery.py [--outage 35] [--window 60]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nodeagent.agent.service import Agent  # noqa: E402
from nodeagent.metrics.kube import KUBE_REQUESTS  # noqa: E402
from nodeagent.mig.config import dump_config  # noqa: E402
from nodeagent.mig.generate import generate_configs  # noqa: E402
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory  # noqa: E402
from nodeagent.sim import SimulatedNvml, parse_spec  # noqa: E402
from tests.support.agent import make_agent  # noqa: E402
from tests.support.dra import dra_group  # noqa: E402
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet  # noqa: E402
from tests.support.k8s import (  # noqa: E402
    claim_pod,
    create_device_classes,
    k8s_available,
    make_node,
    start_control_plane,
    stop_control_plane,
)

DRIVER = "gpu.nodeagent.io"
NAMESPACE = "recovery"
PORT_BASE = 3700  # apart from the suite's planes
SELECTOR = f'device.attributes["{DRIVER}"].profile == "1g.18gb"'


def counts() -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for (verb, resource, _code), n in KUBE_REQUESTS.counts().items():
        out[(verb, resource)] += n
    return out


def stop_apiserver(state: Path) -> None:
    pid = int((state / "pids" / "kube-apiserver").read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def claim_body(name: str) -> dict[str, Any]:
    exactly = {
        "deviceClassName": "mig.gpu.nodeagent.io",
        "selectors": [{"cel": {"expression": SELECTOR}}],
    }
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}},
    }


def build_agent(root: Path, node: str, kubeconfig: Path) -> tuple[Agent, NvmlSession]:
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    for gpu in read_inventory(session).gpus:
        MigWriter(session).set_mig_mode(gpu.index, True)
    mig = root / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    agent = make_agent(
        session, lib.reset, root / "mig.lock",
        reconcile={"interval_seconds": 300},
        mig={"config_file": str(mig)},
        kube={"enabled": True, "node_name": node, "kubeconfig": str(kubeconfig),
              "pod_resources_socket": None},
        dra=dra_group(root),
    )  # fmt: skip
    return agent, session


def run(outage: float, window: float) -> dict[str, Any]:
    from kubernetes import client, config

    with tempfile.TemporaryDirectory(prefix="rec-", dir="/tmp") as tmp:
        root = Path(tmp)
        cp = start_control_plane(root / "k8s", port_base=PORT_BASE)
        agent = None
        try:
            cfg = client.Configuration()
            config.load_kube_config(str(cp.kubeconfig), client_configuration=cfg)
            api_client = client.ApiClient(cfg)
            core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
            create_device_classes(api_client)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            node = f"rec-{uuid.uuid4().hex[:6]}"
            make_node(api_client, node)
            agent, _session = build_agent(root / "a", node, cp.kubeconfig)
            agent.start()
            kubelet = FakeDraKubelet(root / "a" / "reg")
            kubelet.register(DRIVER)
            time.sleep(10)  # idle: its slices published, its watches open

            stop_apiserver(cp.state)
            time.sleep(outage)
            start_control_plane(cp.state, port_base=PORT_BASE)  # up.sh: what is not running
            recovered = time.monotonic()
            before = counts()
            name = "during-outage"
            resource.create_namespaced_resource_claim(NAMESPACE, claim_body(name))
            core.create_namespaced_pod(NAMESPACE, claim_pod(name, node))
            bound = prepared = None
            while time.monotonic() - recovered < window:
                if bound is None and core.read_namespaced_pod(name, NAMESPACE).spec.node_name:
                    bound = time.monotonic() - recovered
                    uid = resource.read_namespaced_resource_claim(name, NAMESPACE).metadata.uid
                    answer = kubelet.prepare([Claim(NAMESPACE, name, uid)])[uid]
                    if answer.error:
                        raise SystemExit(f"the prepare failed: {answer.error}")
                    prepared = time.monotonic() - recovered
                time.sleep(0.2)
            after = counts()
        finally:
            if agent is not None:
                agent.stop()
            stop_control_plane(cp)
    first_minute = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    return {"requests": first_minute, "bound": bound, "prepared": prepared}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=35.0, help="seconds kube-apiserver is down")
    parser.add_argument("--window", type=float, default=60.0, help="seconds counted after recovery")
    args = parser.parse_args()
    if not k8s_available():
        print("../shared/k8s is not beside this checkout: no control plane", file=sys.stderr)
        return 2
    result = run(args.outage, args.window)
    print(
        f"requests in the first {args.window:.0f} s after a {args.outage:.0f} s kube-apiserver outage"
    )
    print(f"{'verb':<8} {'resource':<16} {'requests':>8}")
    for (verb, res), n in sorted(result["requests"].items(), key=lambda kv: -kv[1]):
        print(f"{verb:<8} {res:<16} {n:>8}")
    print(f"{'all':<25} {sum(result['requests'].values()):>8}")

    def seconds(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else f"not within {args.window:.0f} s"

    print(
        f"claim created at recovery: bound after {seconds(result['bound'])}, prepared after {seconds(result['prepared'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
