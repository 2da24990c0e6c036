"""Per-GPU sharing through the pipeline on an emulated 8xH200 node with the fake MPS daemon, served
without NVIDIA's device plugin (bare metal: flat MPS layout, no plugin config written): every
transition between four sharing configs converges with the fewest MIG operations, the MPS
daemon restarts only when its set of GPUs changes, a fault at any mutation converges on the next
run, and labels and metrics say what each GPU offers. Where the plugin serves the node:
tests/integration/test_sharing_plugin.py."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.agent.service import Agent
from nodeagent.nvml import read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.faults import Fault
from tests.support.sharing import sharing_node

BALANCED = '{"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}'
CONFIGS = f"""version: nodeagent/v1
sharing-configs:
  mixed:
    - devices: [0, 1]
      mig: {{mig-devices: {BALANCED}}}
    - devices: [2, 3]
      mps: {{replicas: 4}}
    - devices: [4]
      time-slicing: {{replicas: 4}}
    - devices: [5, 6, 7]
      whole: {{}}
  rotated:
    - devices: [0, 1]
      mps: {{replicas: 4}}
    - devices: [2, 3]
      mig: {{mig-devices: {BALANCED}}}
    - devices: [4]
      whole: {{}}
    - devices: [5, 6, 7]
      time-slicing: {{replicas: 2}}
  more-mps:
    - devices: [0, 1]
      mps: {{replicas: 4}}
    - devices: [2, 3]
      mps: {{replicas: 4}}
    - devices: [4, 5, 6, 7]
      mig: {{mig-devices: {{"7g.141gb": 1}}}}
  all-whole:
    - devices: all
      whole: {{}}
"""
NAMES = ("mixed", "rotated", "more-mps", "all-whole")
MPS_GPUS = {"mixed": (2, 3), "rotated": (0, 1), "more-mps": (0, 1, 2, 3), "all-whole": ()}


@pytest.fixture
def node(tmp_path: Path, fake_mps_control: str) -> Iterator[tuple[Agent, SimulatedNvml, Path]]:
    with sharing_node(tmp_path, "h200x8", CONFIGS, fake_mps_control) as (agent, lib):
        yield agent, lib, tmp_path


def _want(agent: Agent, name: str) -> None:
    agent.settings = dataclasses.replace(
        agent.settings, sharing=dataclasses.replace(agent.settings.sharing, config=name)
    )


def _matches(agent: Agent) -> bool:
    plan = agent.pipeline.run_once(dry_run=True)
    return plan.result == "success" and not plan.done and plan.mps_change in ("none", "adopt")


def test_every_transition_converges(node: tuple[Agent, SimulatedNvml, Path]) -> None:
    agent, _, _tmp = node
    counts: dict[tuple[str, str], int] = {}
    pid_before: int | None = None
    previous = None
    for name in ("mixed", *(b for pair in itertools.permutations(NAMES, 2) for b in pair)):
        _want(agent, name)
        report = agent.pipeline.run_once()
        assert report.result == "success", (previous, name, report.reason)
        assert _matches(agent), (previous, name)
        assert agent.mps.serving == MPS_GPUS[name]
        pid = agent.mps.status.pid if agent.mps.status else None
        if previous is not None and MPS_GPUS[previous] == MPS_GPUS[name] and MPS_GPUS[name]:
            assert pid == pid_before, f"{previous} -> {name} restarted the MPS daemon"
        if previous is not None:
            counts[(previous, name)] = report.operations
        offers = agent.pipeline.per_gpu
        assert {i for i, (s, _) in offers.items() if s == "mps"} == set(MPS_GPUS[name])
        previous, pid_before = name, pid
    # Fewest operations: a balanced GPU is 9 NVML calls to build (mode, 4 GIs, 4 CIs) and 9 to
    # tear down; GPUs whose MIG geometry stays are not touched.
    assert counts[("mixed", "rotated")] == 4 * 9  # GPUs 0, 1 torn down; 2, 3 built
    assert counts[("all-whole", "mixed")] == 2 * 9
    assert counts[("rotated", "more-mps")] == 2 * 9 + 4 * 3  # 2, 3 torn down; 4-7 one 7g each
    print("operations per transition:", counts)


def test_labels_and_metrics_say_what_each_gpu_offers(
    node: tuple[Agent, SimulatedNvml, Path],
) -> None:
    agent, _, _tmp = node
    _want(agent, "mixed")
    agent.reconcile()
    labels = {}
    for sink_labels in [agent.pipeline.per_gpu]:
        labels = sink_labels
    assert labels[0] == ("mig", 1) and labels[2] == ("mps", 4) and labels[4] == ("time-slicing", 4)
    assert labels[7] == ("whole", 1)
    value = agent.registry.get_sample_value
    assert (
        value(
            "nodeagent_gpu_sharing_info", {"gpu": "4", "strategy": "time-slicing", "replicas": "4"}
        )
        == 1
    )
    assert (
        value("nodeagent_gpu_sharing_info", {"gpu": "2", "strategy": "mps", "replicas": "4"}) == 1
    )
    _want(agent, "all-whole")
    agent.reconcile()
    assert set(agent.pipeline.per_gpu.values()) == {("whole", 1)}


def _fault_sweep(agent: Agent, lib: SimulatedNvml, start: str, goal: str, ks: list[int]) -> None:
    for k in ks:
        _want(agent, start)
        assert agent.pipeline.run_once().result == "success"
        _want(agent, goal)
        lib.faults.faults.append(Fault(mutation=lib.faults.mutations + k, error=999))
        failed = agent.pipeline.run_once()
        assert failed.result == "failure" and failed.step == "apply", (k, failed.reason)
        lib.faults.faults.clear()
        again = agent.pipeline.run_once()
        assert again.result == "success", (k, again.reason)
        assert _matches(agent), k


def test_a_fault_at_every_mutation_converges_on_the_next_run(
    node: tuple[Agent, SimulatedNvml, Path],
) -> None:
    """GPUs 0 and 1 from balanced to one 7g slice each, MPS on 2 and 3 kept: a fault at each
    of the 20 NVML mutations, then a clean run converges (and the daemon is never touched)."""
    agent, lib, tmp = node
    (tmp / "sharing.yaml").write_text(
        CONFIGS + '  mixed-7g:\n    - devices: [0, 1]\n      mig: {mig-devices: {"7g.141gb": 1}}\n'
        "    - devices: [2, 3]\n      mps: {replicas: 4}\n"
    )
    _want(agent, "mixed")
    assert agent.pipeline.run_once().result == "success"
    pid = agent.mps.status.pid if agent.mps.status else None
    _want(agent, "mixed-7g")
    total = agent.pipeline.run_once(dry_run=True).done
    assert len(total) == 20
    _fault_sweep(agent, lib, "mixed", "mixed-7g", list(range(1, len(total) + 1)))
    assert agent.mps.status is not None and agent.mps.status.pid == pid


def test_a_fault_while_mps_moves_converges_on_the_next_run(
    node: tuple[Agent, SimulatedNvml, Path],
) -> None:
    """MIG from GPUs 0, 1 to 2, 3 and MPS the other way (36 mutations, the daemon restarted):
    a fault at each kind of operation on both sides converges."""
    agent, lib, _ = node
    _want(agent, "mixed")
    assert agent.pipeline.run_once().result == "success"
    _want(agent, "rotated")
    assert len(agent.pipeline.run_once(dry_run=True).done) == 36
    _fault_sweep(agent, lib, "mixed", "rotated", [1, 5, 9, 10, 19, 23, 28, 36])


def test_conflicts_are_refused_before_anything_changes(
    node: tuple[Agent, SimulatedNvml, Path],
) -> None:
    agent, _lib, tmp = node
    (tmp / "sharing.yaml").write_text(
        CONFIGS + "  split-mps:\n    - devices: [0]\n      mps: {replicas: 2}\n"
        "    - devices: [1]\n      mps: {replicas: 4}\n"
    )
    _want(agent, "split-mps")
    report = agent.pipeline.run_once()
    assert report.step == "resolve" and "replicas" in (report.reason or "")
    assert not any(g.mig_current for g in read_inventory(agent.session).gpus)
    assert agent.mps.daemon is None
