"""`nodeagent run --kube` as a process where Kubernetes does not answer: an API server that is
down at start, a kubeconfig exec credential plugin that hangs or fails. SIGTERM ends it with
exit 0 and one log line; a plugin has a timeout; its token is what the requests carry."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.kube.api import KubeSettings, make_api_client
from tests.support.cli import Result, assert_one_error
from tests.support.cluster import Cluster, is_write

PLUGIN = """#!{python}
import json, os, sys, time
mode = sys.argv[1]
open(os.environ["PLUGIN_PID_FILE"], "w").write(str(os.getpid()))
if mode == "hang":
    time.sleep(3600)
if mode == "fail":
    sys.exit("plugin: no credentials for this cluster")
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": "token-from-plugin",
                             "expirationTimestamp": "2099-01-01T00:00:00Z"}}}}))
"""


def _kubeconfig(tmp_path: Path, server: str, mode: str) -> Path:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "args": [mode],
        "env": [{"name": "PLUGIN_PID_FILE", "value": str(tmp_path / "plugin.pid")}],
        "interactiveMode": "Never",
    }
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"exec": exec_}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


class Agent:
    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.log = tmp_path / "stderr.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        env["NODE_NAME"] = "worker-1"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "--simulate", "h200", "run", "--kube",
                 "--metrics-address", "127.0.0.1:0", "--pod-resources-socket", "",
                 "--watch-timeout", "1", *flags],
                env=env, stderr=err, stdout=subprocess.DEVNULL,
            )  # fmt: skip

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert self.proc.poll() is None, f"ended before {what}: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"no {what}: {self.log.read_text()}"
            time.sleep(0.05)

    def stop(self) -> list[str]:
        """SIGTERM; asserts exit 0, no traceback; the lines other than retries."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=20) == 0, self.log.read_text()
        assert "Traceback" not in self.log.read_text()
        return [line for line in self.lines() if '"kube.retry"' not in line]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []

    def start(*flags: str) -> Agent:
        started.append(Agent(tmp_path, *flags))
        return started[-1]

    yield start
    for a in started:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_sigterm_while_the_api_server_is_down_at_start_exits_0(
    agent: Callable[..., Agent],
) -> None:
    """The first read of the Node is retrying (connection refused): SIGTERM ends the agent with
    exit 0 and one line saying what the stop cut short (was exit 3 and an error sentence)."""
    a = agent("--kube-host", f"http://127.0.0.1:{_closed_port()}")
    a.wait(lambda: any('"kube.retry"' in line for line in a.lines()), "a logged retry")
    rest = a.stop()
    assert len(rest) == 1 and "agent.stopped_while_starting" in rest[0], rest
    assert "connection refused" in rest[0]  # in our words (issue 39 class 10)


def _plugin_pid(tmp_path: Path) -> int | None:
    try:
        return int((tmp_path / "plugin.pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_during_a_hung_exec_plugin_exits_0_and_ends_the_plugin(
    agent: Callable[..., Agent], tmp_path: Path
) -> None:
    kubeconfig = _kubeconfig(tmp_path, f"http://127.0.0.1:{_closed_port()}", "hang")
    a = agent("--kubeconfig", str(kubeconfig))
    a.wait(lambda: _plugin_pid(tmp_path) is not None, "the plugin started")
    rest = a.stop()
    assert len(rest) == 1 and "agent.stopped_while_starting" in rest[0], rest
    pid = _plugin_pid(tmp_path)
    assert pid is not None and not _alive(pid)


def test_an_exec_plugin_that_hangs_is_ended_at_its_timeout(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path, "http://127.0.0.1:1", "hang")
    settings = KubeSettings(node_name="n", kubeconfig=str(kubeconfig), exec_timeout_seconds=1)
    with pytest.raises(KubeError, match=r"plugin\.py did not answer within 1 s"):
        make_api_client(settings, threading.Event())
    pid = _plugin_pid(tmp_path)
    assert pid is not None and not _alive(pid)


def test_an_exec_plugin_that_fails_is_one_sentence_exit_3(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    kubeconfig = _kubeconfig(tmp_path, "http://127.0.0.1:1", "fail")
    res = cli("--simulate", "h200", "run", "--kube", "--node-name", "n", "--metrics-address",
              "127.0.0.1:0", "--kubeconfig", str(kubeconfig))  # fmt: skip
    assert_one_error(res, 3, "exec plugin", "failed (exit 1)", "no credentials for this cluster")


def test_the_exec_plugins_token_is_sent(
    agent: Callable[..., Agent], cluster: Cluster, tmp_path: Path
) -> None:
    cluster.add_node("worker-1")
    a = agent("--kubeconfig", str(_kubeconfig(tmp_path, cluster.url, "token")))
    cluster.wait(lambda: "nvidia.com/gpu.product" in cluster.labels("worker-1"), what="labels")
    # The writes are the agent's (the test only reads).
    auth = [r.headers.get("Authorization") for r in list(cluster.km) if is_write(r)]
    assert auth and set(auth) == {"Bearer token-from-plugin"}
    a.stop()
