"""mig-manager's host duties against a real HTTP Kubernetes API (kmock): the `rebooting` state
when an Ampere MIG mode change waits for a reboot (NVIDIA/mig-parted bd7160f4,
pkg/mig/reconfigure/reconfigure.go: WITH_REBOOT, `chroot /host reboot`), the agent converging
when it starts again after the reboot, and `failed` when the reboot did not apply the mode.
The emulator's `a100-40gb:no-reset` GPUs refuse a GPU reset (a pass-through VM), so their
mode stays pending until `sim reboot`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.sim import SimulatedNvml
from tests.support.agent import Agents, emulated_node
from tests.support.cluster import PODS, Cluster, kube_group
from tests.support.host import fake_command, recorded

NODE = "gpu-node-1"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
REASON = "nodeagent.io/mig.config.reason"
SPEC = "a100-40gbx2:no-reset"

Start = Callable[..., tuple[Agent, SimulatedNvml]]


@pytest.fixture
def start_agent(cluster: Cluster, agents: Agents, tmp_path: Path) -> Start:
    """Starts an agent on the emulated node kept in one state file (so that a second agent,
    after `reboot()`, sees the same GPUs); the previous agent is stopped first."""
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    cluster.on_loop(lambda: cluster.km.resources.__setitem__(PODS, {}))

    def start(mig: dict[str, Any] | None = None, spec: str = SPEC) -> tuple[Agent, SimulatedNvml]:
        if agents.started:
            agents.started[-1].stop()
        lib, session = emulated_node(spec, tmp_path / "node.json")
        # no MIG config file: the configs generated from the GPUs
        agent = agents.start(session, lib.reset, mig=mig or {}, kube=kube_group(cluster, NODE))
        return agent, lib

    return start


def test_with_reboot_the_state_says_rebooting_then_the_agent_reboots_and_converges(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    script = fake_command(tmp_path, "reboot")
    mig = {"with_reboot": True, "reboot_command": f"{script} --now"}
    _, lib = start_agent(mig)
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "rebooting", what="rebooting")
    cluster.wait(lambda: recorded(script), what="the reboot command")
    assert recorded(script) == ["reboot --now"]
    assert "pending until the node reboots" in cluster.annotations(NODE)[REASON]
    assert [(g.mig_current, g.mig_pending) for g in lib.state.gpus] == [(0, 1), (0, 1)]
    assert "MigConfigRebooting" in [e["reason"] for e in cluster.events()]
    # The node reboots; the agent starts again, finds the mode applied and goes on.
    lib.reboot()
    _, lib = start_agent(mig)
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert [len(g.gis) for g in lib.state.gpus] == [4, 4]
    assert REASON not in cluster.annotations(NODE)
    assert recorded(script) == ["reboot --now"]  # rebooted once


@pytest.mark.parametrize("with_reboot", [False, True])
def test_a_mode_still_pending_after_the_reboot_fails_and_is_not_rebooted_for_again(
    cluster: Cluster, start_agent: Start, tmp_path: Path, with_reboot: bool
) -> None:
    script = fake_command(tmp_path, "reboot")
    mig = {"with_reboot": with_reboot, "reboot_command": str(script)}
    agent, _ = start_agent(mig)
    cluster.label(NODE, {CONFIG: "all-enabled"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "rebooting", what="rebooting")
    ready, why = agent.ready()
    assert not ready and "reboot" in why, why
    # The agent starts again but the reboot did not apply the mode (no `lib.reboot()`).
    start_agent(mig)
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    assert "the node rebooted and it is still pending" in cluster.annotations(NODE)[REASON]
    assert recorded(script) == (["reboot"] if with_reboot else [])  # no reboot loop


def test_a_reboot_command_that_fails_is_the_configs_failure(
    cluster: Cluster, start_agent: Start
) -> None:
    start_agent({"with_reboot": True, "reboot_command": "false"})
    cluster.label(NODE, {CONFIG: "all-enabled"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert reason.startswith("reboot: the reboot command 'false' exited with 1"), reason


def test_cdi_refresh_runs_after_the_change_and_before_success(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    """The fake nvidia-ctk records the state label it finds when it runs: still `pending`."""
    seen = tmp_path / "state-seen"
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text(
        f"#!{sys.executable}\nimport json, sys, urllib.request\n"
        f"node = json.load(urllib.request.urlopen('{cluster.url.rstrip('/')}/api/v1/nodes/{NODE}'))\n"
        f"with open('{seen}', 'a') as f:\n"
        f"    f.write(' '.join(sys.argv[1:2]) + '=' + node['metadata']['labels'].get('{STATE}', '') + '\\n')\n"
    )
    ctk.chmod(0o755)
    commands = [f"{ctk} system create-device-nodes", f"{ctk} cdi generate --mode=management"]
    start_agent({"cdi_refresh": True, "cdi_commands": tuple(commands)}, spec="h200x2")
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="success")
    assert seen.read_text().splitlines() == ["system=pending", "cdi=pending"]


def test_a_failing_cdi_refresh_is_the_configs_failure(
    cluster: Cluster, start_agent: Start, tmp_path: Path
) -> None:
    fake_command(tmp_path, "nvidia-ctk", exit_code=1, says="cannot write /var/run/cdi")
    start_agent(
        {"cdi_refresh": True, "cdi_commands": (f"{tmp_path / 'nvidia-ctk'} cdi generate",)},
        spec="h200x2",
    )
    cluster.label(NODE, {CONFIG: "all-balanced"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="failed")
    reason = cluster.annotations(NODE)[REASON]
    assert reason.startswith("cdi: the CDI refresh command"), reason
    assert reason.endswith("exited with 1: cannot write /var/run/cdi"), reason
