"""`nodeagent run --kube` as a process against the kmock API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import Result, assert_one_error
from tests.support.cluster import Cluster


def test_run_kube_applies_the_node_label(
    cluster: Cluster, tmp_path: Path, cli: Callable[..., Result]
) -> None:
    base = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "s.json")]
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*base, "mig", "generate-config").stdout)
    cluster.add_node("worker-7", {"nvidia.com/mig.config": "all-2g.35gb"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["NODE_NAME"] = "worker-7"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodeagent",
            *base,
            "run",
            "--kube",
            "--kube-host",
            cluster.url,
            "-f",
            str(mig),
            "--metrics-address",
            "127.0.0.1:0",
            "--pod-resources-socket",
            "",
            "--watch-timeout",
            "1",
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        cluster.wait(
            lambda: cluster.labels("worker-7").get("nvidia.com/mig.config.state") == "success",
            timeout=60,
            what="success",
        )
        cluster.wait(
            lambda: cluster.labels("worker-7").get("nvidia.com/mig-2g.35gb.count") == "6",
            what="labels",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    status = cli(*base, "mig", "assert", "-f", str(mig), "-c", "all-2g.35gb")
    assert status.returncode == 0


def test_sigterm_during_an_api_outage_exits_within_5_s(
    cluster: Cluster, tmp_path: Path, cli: Callable[..., Result]
) -> None:
    """The API server goes away; the agent's calls are retrying with backoff. SIGTERM still
    ends it at once (retries stop when the agent stops), exit 0."""
    base = ["--simulate", "h200", "--sim-state", str(tmp_path / "s.json")]
    cluster.add_node("worker-8", {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["NODE_NAME"] = "worker-8"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodeagent", *base, "run", "--kube", "--kube-host", cluster.url,
         "--metrics-address", "127.0.0.1:0", "--pod-resources-socket", "",
         "--watch-timeout", "1"],
        env=env,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        cluster.wait(lambda: "nvidia.com/gpu.product" in cluster.labels("worker-8"), what="labels")
        cluster.close()  # the outage: connections refused from now on
        time.sleep(1)  # the watch (1 s) has ended and its relist is retrying
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_kube_needs_a_node_name(cli: Callable[..., Result]) -> None:
    assert_one_error(cli("--simulate", "h200", "run", "--kube"), 2, "NODE_NAME")
    assert_one_error(
        cli("--simulate", "h200", "run", "--kube", "--node-name", "n", "-c", "x", "-f", "y"),
        2,
        "comes from the node label",
    )
