"""The agent's Node informer against the real API server (v1.36.2): one `nvidia.com/mig.config`
label change gives exactly one reconcile run. The agent's own patches (the `pending` and
`success` states, its labels) come back through its watch; the view, guarded by
resourceVersion, already holds them from the patches' answers, so they wake nothing."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent
from tests.support.k8s import ControlPlane, make_node
from tests.support.wait import wait_for

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


def _runs(agent: Agent) -> int:
    with agent.stats.lock:
        return sum(agent.stats.reconciles.values())


def _settled(agent: Agent, core: Any, name: str) -> bool:
    """The reconcile worker idle and not woken, and the watch has seen the Node as it is now
    (every patch of the agent's came back through it)."""
    worker = agent.workers["reconcile"]
    now = core.read_node(name).metadata.resource_version
    seen = agent.watcher.informer.version if agent.watcher is not None else None
    return (
        not worker.busy
        and not worker.wake_event.is_set()
        and seen is not None
        and int(seen) >= int(now)
    )


def test_one_label_change_is_one_reconcile_run(
    control_plane: ControlPlane, api_client: Any, short_tmp: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"informer-{uuid.uuid4().hex[:8]}"
    make_node(api_client, name)
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    mig = short_tmp / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    agent = make_agent(
        session,
        lib.reset,
        short_tmp / "mig.lock",
        reconcile={"interval_seconds": 3600},
        mig={"config_file": str(mig)},
        kube={
            "enabled": True,
            "node_name": name,
            "kubeconfig": str(control_plane.kubeconfig),
            "watch_timeout_seconds": 30,
            "pod_resources_socket": None,
        },
    )
    agent.start()
    try:
        wait_for(lambda: _settled(agent, core, name), "the agent idle after its start", 60)
        before = _runs(agent)

        core.patch_node(name, {"metadata": {"labels": {CONFIG: "all-1g.18gb"}}})

        wait_for(
            lambda: core.read_node(name).metadata.labels.get(STATE) == "success", "success", 60
        )
        wait_for(lambda: _settled(agent, core, name), "the agent idle after the change", 60)
        assert _runs(agent) == before + 1
        assert [len(g.slices) for g in read_inventory(session).gpus] == [7, 7]
    finally:
        agent.stop()
        session.close()
        core.delete_node(name)
