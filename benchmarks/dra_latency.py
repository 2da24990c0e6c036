"""From claim to pod bound and to prepared, through the real kube-scheduler (issue 31): for each
DRA mode, with binding conditions on and off, p50/p99 over at least 50 claims.

kube-apiserver, kube-scheduler and kube-controller-manager v1.36.2 (../shared/k8s, started
here and stopped at the end); for each mode and each binding setting a fresh Node (no kubelet:
allocatable given) with an emulated 4 x H200, nodeagent's DRA plugin in this process (its
ResourceSlices published, its binding watcher running as the agent's dra-bind worker does) and
the tests' fake kubelet. Each round creates as many claims (and a pod each, referencing it) as
the node can hold at once; a claim's times run from its creation to its pod's nodeName being
set (bound) and to the fake kubelet's NodePrepareResources answering (prepared), which it
calls as soon as the pod is bound; then unprepare and delete. Modes:

    slice   a 1g.18gb MIG slice (MIG on, no slice made: made by the binding watcher before the
            pod binds with binding conditions, by the prepare without)
    whole   a whole GPU (MIG off)
    mps     an MPS share of a whole GPU (threadPercentage 25: a daemon per claim)

The emulator models NVML's latency (NODEAGENT_SIM_LATENCY=h200: create GI 0.25 s, CI 0.10 s,
the figures benchmarks/dra.py uses). Run from the repository root in the project's .venv:

    python benchmarks/dra_latency.py [--claims 56] [--plot benchmarks/dra-latency.png]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from nodeagent.agent.factory import dra_driver  # noqa: E402
from nodeagent.dra.k8s.driver import DraDriver  # noqa: E402
from nodeagent.dra.node import NodeConfig  # noqa: E402
from nodeagent.kube.api import KubeSettings  # noqa: E402
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory  # noqa: E402
from nodeagent.settings import Settings  # noqa: E402
from nodeagent.sim import open_emulator  # noqa: E402
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet  # noqa: E402
from tests.support.fake_mps.script import control_script  # noqa: E402
from tests.support.k8s import (  # noqa: E402
    claim_pod,
    create_device_classes,
    k8s_available,
    make_node,
    start_control_plane,
    stop_control_plane,
)

DRIVER = "gpu.nodeagent.io"
NAMESPACE = "latency"
SPEC = "h200x4"
SLICE_SELECTOR = f'device.attributes["{DRIVER}"].profile == "1g.18gb"'
MODES: dict[str, dict[str, Any]] = {
    "slice": {
        "class": "mig.gpu.nodeagent.io",
        "selector": SLICE_SELECTOR,
        "per_round": 28,
        "mig": True,
    },
    "whole": {"class": "gpu.nodeagent.io", "per_round": 4, "mig": False},
    "mps": {"class": "gpu.nodeagent.io", "per_round": 4, "mig": False, "mps": 25},
}


def claim_body(name: str, mode: dict[str, Any]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": mode["class"]}
    if "selector" in mode:
        exactly["selectors"] = [{"cel": {"expression": mode["selector"]}}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "g", "exactly": exactly}]}}
    if "mps" in mode:
        params = {
            "apiVersion": f"{DRIVER}/v1",
            "kind": "MpsConfig",
            "threadPercentage": mode["mps"],
        }
        spec["devices"]["config"] = [
            {"requests": ["g"], "opaque": {"driver": DRIVER, "parameters": params}}
        ]
    return {"metadata": {"name": name}, "spec": spec}


def run_mode(
    api_client: Any, cp: Any, root: Path, name: str, binding: bool, total: int
) -> tuple[list[float], list[float]]:
    """(bound seconds, prepared seconds) of `total` claims of mode `name`."""
    from kubernetes import client

    mode = MODES[name]
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = f"lat-{name}-{'on' if binding else 'off'}-{uuid.uuid4().hex[:4]}"
    make_node(api_client, node)
    d = root / node.rsplit("-", 1)[1]  # short: MPS pipe paths are at most 96 bytes
    d.mkdir()
    session = NvmlSession(open_emulator(SPEC, d / "sim.json"))  # NVML's write times modelled
    if mode["mig"]:
        for gpu in read_inventory(session).gpus:
            MigWriter(session).set_mig_mode(gpu.index, True)
    base = Settings()
    dra = replace(
        base.dra, enabled=True, plugin_dir=d / "p", registry_dir=d / "reg", cdi_dir=d / "cdi",
        binding_conditions=binding,
    )  # fmt: skip
    mps = replace(base.mps, control=os.environ["MPS_CONTROL"])  # the plugin's own NodeConfig
    settings = replace(base, dra=dra, mps=mps)
    config = NodeConfig(DRIVER, node, d / "p", d / "cdi", mps_control=os.environ["MPS_CONTROL"])
    driver = dra_driver(session, settings, config, lambda i: None, d / ".sim.json.lock")
    kube = KubeSettings(node_name=node, kubeconfig=str(cp.kubeconfig), retry_seconds=5)
    plugin = DraDriver(session, settings, kube, driver.engine, driver.owners)
    plugin.start()
    stop = threading.Event()
    binder = threading.Thread(
        target=lambda: [plugin.bind() for _ in iter(lambda: stop.wait(0.2), True)]
    )
    binder.start()
    kubelet = FakeDraKubelet(d / "reg")
    kubelet.register(DRIVER)
    bound: list[float] = []
    prepared: list[float] = []
    try:
        plugin.publish(read_inventory(session))
        n = 0
        while n < total:
            batch = min(mode["per_round"], total - n)
            started: dict[str, float] = {}
            for i in range(batch):
                cname = f"{node}-{n + i}"
                started[cname] = time.monotonic()
                resource.create_namespaced_resource_claim(NAMESPACE, claim_body(cname, mode))
                core.create_namespaced_pod(NAMESPACE, claim_pod(cname, node))
            pending = dict(started)
            deadline = time.monotonic() + 120
            refs: list[Claim] = []
            while pending and time.monotonic() < deadline:
                for cname in list(pending):
                    pod = core.read_namespaced_pod(cname, NAMESPACE)
                    if not pod.spec.node_name:
                        continue
                    t_bound = time.monotonic()
                    claim = resource.read_namespaced_resource_claim(cname, NAMESPACE)
                    ref = Claim(NAMESPACE, cname, claim.metadata.uid)
                    answer = kubelet.prepare([ref])[ref.uid]
                    if answer.error:
                        raise SystemExit(f"{name}: prepare of {cname} failed: {answer.error}")
                    bound.append(t_bound - started[cname])
                    prepared.append(time.monotonic() - started[cname])
                    refs.append(ref)
                    del pending[cname]
                time.sleep(0.02)
            if pending:
                raise SystemExit(f"{name}: {len(pending)} pods not bound in 120 s")
            kubelet.unprepare(refs)
            for ref in refs:
                core.delete_namespaced_pod(ref.name, NAMESPACE, grace_period_seconds=0)
                resource.delete_namespaced_resource_claim(ref.name, NAMESPACE)
            for ref in refs:  # the claims gone (their devices free) before the next round
                while True:
                    try:
                        resource.read_namespaced_resource_claim(ref.name, NAMESPACE)
                    except client.exceptions.ApiException as err:
                        if err.status == 404:
                            break
                        raise
                    time.sleep(0.05)
            n += batch
    finally:
        stop.set()
        while binder.is_alive():
            plugin.api.interrupt()
            binder.join(0.5)
        for daemon in (d / "p" / "mps").glob("*/*"):  # left by a claim not unprepared
            subprocess.run(
                [os.environ["MPS_CONTROL"]], input="quit\n", text=True, capture_output=True,
                env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(daemon / "pipe")}, timeout=30,
            )  # fmt: skip
        plugin.stop()
        session.close()
    return bound, prepared


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(q * len(ordered)) - 1, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=56, help="claims a mode and setting")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--plot", default=str(HERE / "dra-latency.png"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not k8s_available():
        raise SystemExit("../shared/k8s is not beside this checkout: no control plane to run")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("NODEAGENT_SIM_LATENCY", "h200")
    from kubernetes import client, config

    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="lat-", dir="/tmp") as tmp:
        root = Path(tmp)
        # the tests' fake MPS control daemon, run by this interpreter (standard library only)
        os.environ["MPS_CONTROL"] = str(control_script(root))
        print("starting the control plane ...", flush=True)
        cp = start_control_plane(root / "k8s", port_base=4500)
        try:
            configuration = client.Configuration()
            config.load_kube_config(str(cp.kubeconfig), client_configuration=configuration)
            api_client = client.ApiClient(configuration)
            client.CoreV1Api(api_client).create_namespace({"metadata": {"name": NAMESPACE}})
            create_device_classes(api_client)
            for name in args.modes.split(","):
                for binding in (True, False):
                    label = f"{name}, binding conditions {'on' if binding else 'off'}"
                    print(f"{label}: {args.claims} claims ...", flush=True)
                    b, p = run_mode(api_client, cp, root, name, binding, args.claims)
                    results[label] = {"bound": b, "prepared": p}
                    print(
                        f"  bound p50 {statistics.median(b):.2f} s p99 {pct(b, 0.99):.2f} s,"
                        f" prepared p50 {statistics.median(p):.2f} s p99 {pct(p, 0.99):.2f} s",
                        flush=True,
                    )
        finally:
            stop_control_plane(cp)
    print(
        f"\n{'mode':<36}{'claims':>7}{'bound p50':>11}{'p99':>8}{'prepared p50':>14}{'p99':>8}  (s)"
    )
    for label, r in results.items():
        print(
            f"{label:<36}{len(r['bound']):>7}{statistics.median(r['bound']):>11.2f}"
            f"{pct(r['bound'], 0.99):>8.2f}{statistics.median(r['prepared']):>14.2f}"
            f"{pct(r['prepared'], 0.99):>8.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    plot(results, args.plot)


def plot(results: dict[str, dict[str, list[float]]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(no plot: matplotlib is not installed; {path} not written)")
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = list(results)
    x = range(len(labels))
    for offset, key in ((-0.2, "bound"), (0.2, "prepared")):
        p50 = [statistics.median(results[k][key]) for k in labels]
        p99 = [pct(results[k][key], 0.99) for k in labels]
        ax.bar([i + offset for i in x], p50, 0.4, label=f"{key} p50")
        ax.scatter([i + offset for i in x], p99, marker="_", s=300, color="black")
    ax.set_xticks(list(x), [lab.replace(", ", "\n") for lab in labels], fontsize=8)
    ax.set_ylabel("seconds from the claim's creation (bar p50, dash p99)")
    ax.set_title("claim to pod bound and to prepared, kube-scheduler v1.36.2, emulated 4 x H200")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
