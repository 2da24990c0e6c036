"""What one node's agent asks of the API server when kube-apiserver comes back from an outage
(issue 39, class 2), and how long a claim made at its return waits to be prepared, and where.

A control plane of its own (../shared/k8s, Kubernetes v1.36.2: started here, stopped at the
end; NODEAGENT_K8S_DIR names it for a checkout elsewhere), a Node (no kubelet), and `nodeagent
run --kube --dra` in this process on an emulated 2 x H200 (binding conditions on: the agent's
binding watcher makes a claim's MIG slice before its pod binds). Once the agent is idle,
kube-apiserver is stopped (SIGTERM, by the pid up.sh wrote) for `--outage` seconds and started
again (up.sh starts what is not running and returns once /readyz says ok: the recovery). A
claim for a 1g.18gb slice and its pod are created then; the fake kubelet's
NodePrepareResources is called as soon as the pod is bound.

Printed: the agent's requests (its own nodeagent_kube_requests_total) in the first `--window`
seconds after kube-apiserver was started again, by verb, resource and code, and in all; its
requests while the server was down; when its watches were answered again; and the claim's way,
in seconds after the recovery: kube-scheduler had the pod, then its claim (the pod no longer
gated: its own scheduler_queue_incoming_pods_total and scheduler_pending_pods), the allocation, the agent's binding condition, the pod bound, the prepare answered; and the pod's
Events. Run from the repository root in the project's .venv:

    python benchmarks/recovery.py [--outage 35] [--window 60] [--claim-timeout 180] [--logs DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
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
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet  # noqa: E402
from tests.support.k8s import (  # noqa: E402
    PORTS,
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
CLAIM = "made-at-recovery"


def counts() -> Counter[tuple[str, str, str]]:
    """The agent's requests so far by (verb, resource, code: 'error' where none came)."""
    return Counter(KUBE_REQUESTS.counts())


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
    root.mkdir(parents=True, exist_ok=True)
    mig = root / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    agent = make_agent(
        session, lib.reset, root / "mig.lock",
        reconcile={"interval_seconds": 300},
        mig={"config_file": str(mig)},
        kube={"enabled": True, "node_name": node, "kubeconfig": str(kubeconfig),
              "pod_resources_socket": None},
        dra={"enabled": True, "plugin_dir": root / "p", "registry_dir": root / "reg",
             "cdi_dir": root / "cdi"},
    )  # fmt: skip
    return agent, session


def _ready_since(claim: dict[str, Any]) -> bool:
    """Whether the agent has set the claim's binding condition (its slice made)."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        for cond in entry.get("conditions") or []:
            if cond.get("type", "").endswith("SliceReady") and cond.get("status") == "True":
                return True
    return False


def scheduler_metrics(state: Path) -> dict[str, float]:
    """kube-scheduler's own metrics (its /metrics, as admin): pods it took in (`seen`: its pod
    informer had them), pods held back (`gated`: the DRA plugin's PreEnqueue waits for a claim
    its claim informer does not have yet); {} while it cannot be read."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert
    ctx.load_cert_chain(state / "pki" / "admin.crt", state / "pki" / "admin.key")
    port = PORTS["K8S_SCHED_PORT"] + PORT_BASE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=2
        ) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {"seen": 0.0, "gated": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("scheduler_queue_incoming_pods_total") and 'PodAdd"' in name:
            out["seen"] += float(value)  # event PodAdd, or UnschedulablePodAdd when gated
        elif name == 'scheduler_pending_pods{queue="gated"}':
            out["gated"] = float(value)
    return out


def _timeline(
    core: Any,
    resource: Any,
    kubelet: FakeDraKubelet,
    recovered: float,
    timeout: float,
    scheduler: Callable[[], dict[str, float]],
) -> dict[str, float]:
    """Seconds after the recovery at which each step of the claim's way was first seen (polled
    every 0.1 s, kube-scheduler's metrics every 0.3 s; for at most `timeout` s): the scheduler
    had the pod, then its claim (the pod no longer gated); the allocation, the agent's binding
    condition, the pod bound, the kubelet's prepare answered."""
    import json

    seen: dict[str, float] = {}
    base = scheduler()
    polls = 0
    while time.monotonic() - recovered < timeout and "prepared" not in seen:
        now = time.monotonic() - recovered
        polls += 1
        if polls % 3 == 0 and "claim_seen" not in seen:
            metrics = scheduler()
            if "pod_seen" not in seen and metrics.get("seen", 0) > base.get("seen", 0):
                seen["pod_seen"] = now
            if "pod_seen" in seen and metrics.get("gated") == 0:
                seen["claim_seen"] = now  # no longer gated: its claim informer has the claim
        raw = resource.read_namespaced_resource_claim(CLAIM, NAMESPACE, _preload_content=False)
        claim = json.loads(raw.data)
        if "allocated" not in seen and (claim.get("status") or {}).get("allocation"):
            seen["allocated"] = now
        if "condition_true" not in seen and _ready_since(claim):
            seen["condition_true"] = now
        if "bound" not in seen and core.read_namespaced_pod(CLAIM, NAMESPACE).spec.node_name:
            seen["bound"] = now
            uid = claim["metadata"]["uid"]
            answer = kubelet.prepare([Claim(NAMESPACE, CLAIM, uid)])[uid]
            if answer.error:
                raise SystemExit(f"the prepare failed: {answer.error}")
            seen["prepared"] = time.monotonic() - recovered
        time.sleep(0.1)
    return seen


class Sampler(threading.Thread):
    """From the restart on: the agent's requests counted once `window` s have passed, and the
    moment each of its watches was answered again (its first 2xx list or watch)."""

    def __init__(self, window: float) -> None:
        super().__init__(daemon=True)
        self.window = window
        self.began = time.monotonic()
        self.before = counts()
        self.after: Counter[tuple[str, str, str]] | None = None
        self.back: dict[str, float] = {}  # resource -> seconds after the restart

    def run(self) -> None:
        while True:
            time.sleep(0.05)
            now = time.monotonic() - self.began
            current = counts()
            for (verb, res, code), n in current.items():
                answered = code.startswith("2") and verb in ("list", "watch")
                watched = res in ("nodes", "resourceclaims")
                if answered and watched and n > self.before.get((verb, res, code), 0):
                    self.back.setdefault(res, now)
            if now >= self.window:
                self.after = current
                return

    def requests(self) -> dict[tuple[str, str, str], int]:
        """The requests of the window, by (verb, resource, code); waits for its end."""
        self.join()
        assert self.after is not None
        before = self.before
        return {k: n - before.get(k, 0) for k, n in self.after.items() if n > before.get(k, 0)}


def run(
    outage: float, window: float, claim_timeout: float, logs: Path | None = None
) -> dict[str, Any]:
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

            outage_began = counts()
            stop_apiserver(cp.state)
            time.sleep(outage)
            sampler = Sampler(window)
            during = sum(sampler.before.values()) - sum(outage_began.values())
            sampler.start()
            start_control_plane(cp.state, port_base=PORT_BASE)  # up.sh: what is not running
            recovered = time.monotonic()
            resource.create_namespaced_resource_claim(NAMESPACE, claim_body(CLAIM))
            core.create_namespaced_pod(NAMESPACE, claim_pod(CLAIM, node))
            seen = _timeline(
                core, resource, kubelet, recovered, claim_timeout,
                lambda: scheduler_metrics(cp.state),
            )  # fmt: skip
            requests = sampler.requests()
            events = _pod_events(core, time.time() - (time.monotonic() - recovered))
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for log in (cp.state / "logs").glob("*.log"):
                    shutil.copy(log, logs / log.name)
        finally:
            if agent is not None:
                agent.stop()
            stop_control_plane(cp)
    return {
        "requests": requests,
        "during": during,
        "startup": recovered - sampler.began,
        "back": sampler.back,
        "seen": seen,
        "events": events,
    }


def _pod_events(core: Any, recovered_wall: float) -> list[tuple[float, str, str]]:
    """The scheduler's Events on the pod: (seconds after the recovery, reason, message)."""
    out = []
    for e in core.list_namespaced_event(NAMESPACE).items:
        if e.involved_object.name != CLAIM or e.involved_object.kind != "Pod":
            continue
        when = e.event_time or e.last_timestamp or e.first_timestamp
        at = when.timestamp() - recovered_wall if when is not None else float("nan")
        out.append((at, str(e.reason), str(e.message)))
    return sorted(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=35.0, help="seconds kube-apiserver is down")
    parser.add_argument("--window", type=float, default=60.0, help="seconds counted after recovery")
    parser.add_argument(
        "--claim-timeout", type=float, default=180.0, help="seconds the claim is waited for"
    )
    parser.add_argument("--logs", type=Path, help="a folder to copy the control plane's logs to")
    args = parser.parse_args()
    if not k8s_available():
        print("../shared/k8s is not beside this checkout: no control plane", file=sys.stderr)
        return 2
    result = run(args.outage, args.window, args.claim_timeout, args.logs)
    print(
        f"the agent's requests in the first {args.window:.0f} s after kube-apiserver was started"
        f" again, after {args.outage:.0f} s down (its /readyz ok after {result['startup']:.1f} s)"
    )
    print(f"{'verb':<8} {'resource':<16} {'code':<6} {'requests':>8}")
    for (verb, res, code), n in sorted(result["requests"].items(), key=lambda kv: -kv[1]):
        print(f"{verb:<8} {res:<16} {code:<6} {n:>8}")
    print(f"{'all':<32} {sum(result['requests'].values()):>8}")
    print(f"requests while it was down: {result['during']}")
    for res, at in sorted(result["back"].items()):
        print(f"{res}: answered again {at - result['startup']:+.1f} s after the /readyz ok")
    seen = result["seen"]
    print("the claim made at the recovery (/readyz ok), seconds after it:")
    steps = ("pod_seen", "claim_seen", "allocated", "condition_true", "bound", "prepared")
    for step in steps:
        at = seen.get(step)
        where = f"{at:.1f}" if at is not None else f"not within {args.claim_timeout:.0f}"
        print(f"  {step:<16} {where}")
    for at, reason, message in result["events"]:
        print(f"  pod event at {at:5.1f} s: {reason}: {message[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
