"""mig-manager's protocol, against a real HTTP Kubernetes API (kmock): the GPU clients it pauses
by default and how (NVIDIA/mig-parted bd7160f4, pkg/mig/reconfigure/reconfigure.go), no
`pending` when the config already holds, hooks from mig-parted's hooks file around a change,
and a label key of nodeagent's own beside the operator's mig-manager."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.agent.service import Agent
from nodeagent.mig.config import load_config
from nodeagent.sim import SimulatedNvml
from tests.support.agent import Agents, emulated_node, generated_mig_file
from tests.support.cluster import NODES, PODS, Cluster, kube_group
from tests.support.mig_apply import reconfigure

NODE = "gpu-node-1"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
REASON = "nodeagent.io/mig.config.reason"
DEPLOY = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
OPERATOR_NS = "gpu-operator"

Start = Callable[..., tuple[Agent, SimulatedNvml]]


@pytest.fixture
def start_agent(cluster: Cluster, agents: Agents, tmp_path: Path) -> Start:
    def start(
        labels: dict[str, str] | None = None,
        kube: dict[str, Any] | None = None,
        mig: dict[str, Any] | None = None,
        applied: str | None = None,
    ) -> tuple[Agent, SimulatedNvml]:
        cluster.add_node(NODE, {"kubernetes.io/hostname": NODE, **(labels or {})})
        # A real API server lists pods also when there are none.
        cluster.on_loop(lambda: cluster.km.resources.__setitem__(PODS, {}))
        lib, session = emulated_node()
        path = generated_mig_file(session, tmp_path / "mig.yaml")
        if applied is not None:  # the GPUs already hold this config
            reconfigure(session, load_config(str(path)), applied, lib.reset)
        agent = agents.start(
            session,
            lib.reset,
            mig={"config_file": str(path), **(mig or {})},
            kube=kube_group(cluster, NODE, **{"clients_wait_seconds": 20, **(kube or {})}),
        )
        return agent, lib

    return start


def _slices(lib: SimulatedNvml) -> list[int]:
    return [len(g.gis) for g in lib.state.gpus]


def _history(cluster: Cluster, key: str) -> list[str | None]:
    """Every value the node label `key` had, in order (None: absent)."""
    return [
        (v.get("metadata", {}).get("labels") or {}).get(key)
        for v in cluster.km.objects[NODES, None, NODE].history
        if v
    ]


def _add_daemonset_pod(cluster: Cluster, name: str, selects: str) -> None:
    """A pod of a GPU-operator DaemonSet on the node: controlled by it, selecting `selects`."""
    cluster.km.objects[PODS, OPERATOR_NS, name] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": OPERATOR_NS,
            "labels": {"app": name},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": name,
                    "uid": f"uid-{name}",
                    "controller": True,
                },
            ],
        },
        "spec": {
            "nodeName": NODE,
            "nodeSelector": {selects: "true"},
            "containers": [{"name": "main", "image": "example/gpu-client"}],
        },
    }


class DaemonSetController:
    """Like Kubernetes' DaemonSet controller: a pod whose nodeSelector the node no longer
    matches leaves the node (except those in `stuck`, which never do)."""

    def __init__(self, cluster: Cluster, stuck: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.stuck = stuck
        self.evicted: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DaemonSetController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            # The node is not there yet, or a pod went meanwhile: the next round sees.
            with contextlib.suppress(Exception):
                self._evict()
            time.sleep(0.05)

    def _evict(self) -> None:
        labels = self.cluster.labels(NODE)
        for (res, ns, name), obj in list(self.cluster.km.objects.items()):
            if res != PODS or obj.deleted or name in self.stuck:
                continue
            selector = obj.get("spec", {}).get("nodeSelector") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                self.cluster.api.delete_namespaced_pod(name, ns)
                self.evicted.append(name)


# -- the GPU clients mig-manager pauses ---------------------------------------------------------


def test_the_default_pause_set_is_mig_managers_and_false_stays_untouched(
    cluster: Cluster, start_agent: Start
) -> None:
    """device-plugin, gpu-feature-discovery, dcgm-exporter, dcgm, nvsm and client are paused
    while the MIG change runs and restored after it; `false` is neither paused nor turned into
    `true`; an absent label stays absent; other deploy labels are not touched."""
    labels = {
        DEPLOY + "device-plugin": "true",
        DEPLOY + "gpu-feature-discovery": "true",
        DEPLOY + "dcgm-exporter": "true",
        DEPLOY + "dcgm": "false",  # DCGM switched off on this node by its admin
        DEPLOY + "client": "true",
        DEPLOY + "operator-validator": "true",
        # nvsm: absent
    }
    _add_daemonset_pod(cluster, "nvidia-device-plugin-daemonset", DEPLOY + "device-plugin")
    _add_daemonset_pod(cluster, "third-party-gpu-client", DEPLOY + "client")
    _add_daemonset_pod(cluster, "nvidia-operator-validator", DEPLOY + "operator-validator")
    with DaemonSetController(cluster) as controller:
        _, lib = start_agent(labels)
        cluster.label(NODE, {CONFIG: "all-balanced"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert _slices(lib) == [4, 4]
    for name in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "client"):
        history = _history(cluster, DEPLOY + name)
        assert PAUSED in history, name
        assert history[-1] == "true", name
    assert set(_history(cluster, DEPLOY + "dcgm")) == {"false"}
    assert set(_history(cluster, DEPLOY + "nvsm")) == {None}
    assert set(_history(cluster, DEPLOY + "operator-validator")) == {"true"}
    # The paused DaemonSets' pods left the node; the validator's never had to.
    assert "nvidia-device-plugin-daemonset" in controller.evicted
    assert "third-party-gpu-client" in controller.evicted
    assert "nvidia-operator-validator" not in controller.evicted
    # The change ran while the clients were away: pending, paused, then success.
    states = _history(cluster, STATE)
    dp = _history(cluster, DEPLOY + "device-plugin")
    first_paused = dp.index(PAUSED)
    assert states[first_paused] == "pending"
    assert "success" not in states[: dp.index("true", first_paused)]


def test_a_daemonset_pod_that_never_leaves_fails_the_change_naming_it(
    cluster: Cluster, start_agent: Start
) -> None:
    labels = {DEPLOY + "device-plugin": "true", DEPLOY + "client": "true"}
    _add_daemonset_pod(cluster, "nvidia-device-plugin-daemonset", DEPLOY + "device-plugin")
    _add_daemonset_pod(cluster, "stubborn-client", DEPLOY + "client")
    with DaemonSetController(cluster, stuck=("stubborn-client",)):
        _, lib = start_agent(labels, kube={"clients_wait_seconds": 1})
        cluster.label(NODE, {CONFIG: "all-balanced"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert f"client pods {OPERATOR_NS}/stubborn-client" in reason
    assert "device-plugin pods" not in reason  # that one left
    assert _slices(lib) == [0, 0]
    final = cluster.labels(NODE)
    assert final[DEPLOY + "device-plugin"] == "true" and final[DEPLOY + "client"] == "true"


def test_a_label_left_paused_by_an_interrupted_change_comes_back_true(
    cluster: Cluster, start_agent: Start
) -> None:
    with DaemonSetController(cluster):
        start_agent({DEPLOY + "device-plugin": PAUSED})
        cluster.label(NODE, {CONFIG: "all-balanced"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert cluster.labels(NODE)[DEPLOY + "device-plugin"] == "true"


def test_an_empty_pause_set_pauses_nothing(cluster: Cluster, start_agent: Start) -> None:
    start_agent({DEPLOY + "device-plugin": "true"}, kube={"pause_components": {}})
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert set(_history(cluster, DEPLOY + "device-plugin")) == {"true"}


# -- pending only when something changes ------------------------------------------------------


def test_a_config_that_already_holds_goes_straight_to_success(
    cluster: Cluster, start_agent: Start
) -> None:
    """As mig-manager: `success` without `pending`, no client paused, no change event."""
    labels = {DEPLOY + "device-plugin": "true"}
    _, lib = start_agent(labels, applied="all-balanced")
    assert _slices(lib) == [4, 4]
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert "pending" not in _history(cluster, STATE)
    assert set(_history(cluster, DEPLOY + "device-plugin")) == {"true"}
    assert not [e for e in cluster.events() if e["reason"] == "MigConfigChanging"]
    # A real change afterwards still says pending first.
    cluster.label(NODE, {CONFIG: "all-3g.71gb"})
    cluster.wait(lambda: _slices(lib) == [2, 2], what="the change")
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success again")
    assert "pending" in _history(cluster, STATE)


# -- a label key of its own --------------------------------------------------------------------


def test_a_custom_label_key_leaves_mig_managers_label_alone(
    cluster: Cluster, start_agent: Start
) -> None:
    """Beside the operator's mig-manager: nodeagent follows its own key and its own state label;
    the operator's `nvidia.com/mig.config` (and its state) are never acted on or written."""
    own, own_state = "nodeagent.io/mig.config", "nodeagent.io/mig.config.state"
    agent, lib = start_agent(
        {CONFIG: "all-disabled", STATE: "success"}, kube={"mig_config_label": own}
    )
    cluster.label(NODE, {own: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(own_state) == "success", what="own success")
    assert _slices(lib) == [4, 4]
    assert "pending" in _history(cluster, own_state)
    # mig-manager's label changes: nodeagent does not act on it.
    cluster.label(NODE, {CONFIG: "all-7g.141gb"})
    # The watch has delivered the change; a reconcile now (as any wake-up would run) ignores it.
    wanted = "all-7g.141gb"
    cluster.wait(lambda: agent.watcher.view.labels().get(CONFIG) == wanted, what="seen")
    agent.reconcile()
    assert _slices(lib) == [4, 4]
    assert set(_history(cluster, STATE)) <= {None, "success"}
    assert cluster.labels(NODE)[STATE] == "success"  # as mig-manager left it


# -- hooks ---------------------------------------------------------------------------------------


def _hooks_file(tmp_path: Path, record: Path, fail: str | None = None) -> Path:
    """A mig-parted hooks file whose commands append what they see to `record`; the hook
    named `fail` exits 3 after saying why."""

    def command(name: str) -> dict[str, Any]:
        line = f'echo "{name} $NODEAGENT_HOOK $MIG_PARTED_SELECTED_CONFIG $NODEAGENT_RESULT"'
        tail = "; echo 'no CDI spec for you' >&2; exit 3" if name == fail else ""
        return {"command": "/bin/sh", "args": ["-c", f"{line} >> {record}{tail}"]}

    names = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
    path = tmp_path / "hooks.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "hooks": {n: [command(n)] for n in names}}))
    return path


def test_hooks_run_in_order_around_the_change(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    hooks = _hooks_file(tmp_path, record)
    _, lib = start_agent(mig={"hooks_file": str(hooks)})
    assert not record.exists()  # start() ran the first reconcile: nothing to change, no hook
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert _slices(lib) == [4, 4]
    assert [line.rstrip() for line in record.read_text().splitlines()] == [
        "apply-start apply-start all-balanced",
        "pre-apply-mode pre-apply-mode all-balanced",  # MIG mode changes on both GPUs
        "pre-apply-config pre-apply-config all-balanced",
        "apply-exit apply-exit all-balanced success",
    ]
    # Only instances change now: no pre-apply-mode.
    record.unlink()
    cluster.label(NODE, {CONFIG: "all-3g.71gb"})
    cluster.wait(lambda: _slices(lib) == [2, 2], what="the change")
    cluster.wait(lambda: record.exists() and "apply-exit" in record.read_text(), what="exit")
    assert [line.split()[0] for line in record.read_text().splitlines()] == [
        "apply-start",
        "pre-apply-config",
        "apply-exit",
    ]


def test_a_failing_before_hook_stops_the_change_and_changes_nothing(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    hooks = _hooks_file(tmp_path, record, fail="apply-start")
    _, lib = start_agent({DEPLOY + "device-plugin": "true"}, mig={"hooks_file": str(hooks)})
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert reason.startswith("pause: hook apply-start[0] (")
    assert "exited with 3" in reason and "no CDI spec for you" in reason
    assert str(hooks) in reason  # the file position of the command
    assert _slices(lib) == [0, 0] and not any(g.mig_current for g in lib.state.gpus)
    assert set(_history(cluster, DEPLOY + "device-plugin")) == {"true"}  # never paused
    # apply-start failed: nothing began, so there is no apply-exit (as mig-parted).
    assert [line.split()[0] for line in record.read_text().splitlines()] == ["apply-start"]


def test_a_failing_pre_apply_hook_restores_the_clients_and_runs_apply_exit(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    hooks = _hooks_file(tmp_path, record, fail="pre-apply-config")
    with DaemonSetController(cluster):
        _, lib = start_agent({DEPLOY + "device-plugin": "true"}, mig={"hooks_file": str(hooks)})
        cluster.label(NODE, {CONFIG: "all-balanced"})
        cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    assert "pause: hook pre-apply-config[0]" in cluster.annotations(NODE)[REASON]
    assert _slices(lib) == [0, 0] and not any(g.mig_current for g in lib.state.gpus)
    assert PAUSED in _history(cluster, DEPLOY + "device-plugin")
    assert cluster.labels(NODE)[DEPLOY + "device-plugin"] == "true"
    assert record.read_text().splitlines()[-1] == "apply-exit apply-exit all-balanced failure"


def test_a_bad_hooks_file_fails_before_anything_changes(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    hooks = tmp_path / "hooks.yaml"
    hooks.write_text("version: v1\nhooks:\n  apply_start:\n    - command: /bin/true\n")
    _, lib = start_agent(mig={"hooks_file": str(hooks)})
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert f"{hooks}:3:3: unknown hook 'apply_start'" in reason and reason.startswith("plan: ")
    assert _slices(lib) == [0, 0]
