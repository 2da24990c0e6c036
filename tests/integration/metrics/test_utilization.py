"""Utilization without GPM in the exposition: per GPU and per process from the emulated load,
the process placed on its slice and pod, none under MIG, 0 once a process goes idle, and the
`nodeagent sim attach --load` a user sets seen by `nodeagent metrics`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nodeagent.agent.service import Agent
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Holder, Holders
from tests.integration.metrics.test_health import samples, value
from tests.support.agent import make_agent
from tests.support.cli import Result
from tests.support.metrics import prometheus_tool

GIB = 1024**3
RATES = ("sm", "memory", "encoder", "decoder")
README = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def _process(agent: Agent, gpu: str, pid: str) -> dict[str, float | None]:
    return {
        k: value(agent, f"nodeagent_process_{k}_utilization_ratio", gpu=gpu, pid=pid) for k in RATES
    }


def _info(agent: Agent) -> dict[tuple[str, str], dict[str, str]]:
    return {
        (labels["gpu"], labels["pid"]): labels
        for name, frozen in samples(agent)
        if name == "nodeagent_process_info"
        for labels in [dict(frozen)]
    }


@pytest.mark.parametrize(
    ("spec", "load", "sm", "memory"),
    [
        ("a100-40gb", 0.4, 0.4, 0.09),
        ("a100-80gb", 1.0, 1.0, 0.22),
        ("a30", 0.25, 0.25, 0.06),  # round(0.25 x 22) = 6 %
        ("h100-80gb", 0.5, 0.5, 0.11),
        ("h200", 0.05, 0.05, 0.01),
    ],
)
def test_per_process_and_per_gpu_follow_the_load(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
    spec: str,
    load: float,
    sm: float,
    memory: float,
) -> None:
    agent, _ = agent_factory(spec, None, [(0, "", load)])
    assert _process(agent, "0", "500") == {
        "sm": sm,
        "memory": memory,
        "encoder": 0.0,
        "decoder": 0.0,
    }
    assert value(agent, "nodeagent_gpu_utilization_ratio", gpu="0") == sm
    assert value(agent, "nodeagent_gpu_memory_copy_utilization_ratio", gpu="0") == memory
    assert value(agent, "nodeagent_process_memory_used_bytes", gpu="0", pid="500") == GIB
    assert _info(agent)[("0", "500")]["gi_id"] == ""


def test_nothing_per_process_under_mig_but_where_it_runs(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, _ = agent_factory("a100-40gb", "all-1g.5gb", [(0, "1g.5gb", 1.0)])
    got = {name for name, _ in samples(agent)}
    assert not any(n.startswith("nodeagent_process_") and "utilization" in n for n in got)
    assert "nodeagent_gpu_memory_copy_utilization_ratio" not in got
    assert "nodeagent_gpu_utilization_ratio" not in got
    info = _info(agent)[("0", "500")]
    assert (info["gi_id"], info["ci_id"]) != ("", "")
    assert value(agent, "nodeagent_process_memory_used_bytes", gpu="0", pid="500") == GIB
    assert agent.session.error_counts() == {}  # MIG GPUs are not asked


def test_each_sample_counts_once_and_an_idle_process_reads_0() -> None:
    lib = SimulatedNvml(parse_spec("a30"))
    now = [1_700_000_000.0]
    lib.health_clock = lambda: now[0]  # the emulated driver's and the agent's wall clock
    agent = make_agent(NvmlSession(lib), lib.reset, clock=lambda: now[0])
    lib.attach("0", 31, GIB, 0.5)
    lib.attach("0", 32, GIB, 0.0)  # runs, never busy: NVML sends no sample for it
    agent.refresh()
    assert (_process(agent, "0", "31")["sm"], _process(agent, "0", "32")["sm"]) == (0.5, 0.0)
    agent.refresh()  # within one driver sample period: no newer sample yet, the last stands
    assert _process(agent, "0", "31")["sm"] == 0.5
    now[0] += 1.0
    lib.detach(31)
    lib.attach("0", 31, GIB, 0.0)  # the same pid, idle now
    agent.refresh()  # a second on, no sample newer than the last read: idle
    assert _process(agent, "0", "31")["sm"] == 0.0
    lib.detach(31)
    agent.refresh()
    assert _process(agent, "0", "31") == dict.fromkeys(RATES)
    assert ("0", "31") not in _info(agent)


def _attributed_node() -> Agent:
    """Three A100s with a process each (load 0.5): GPU 0 held by one container, GPU 1's two
    replicas by two containers, GPU 2's two replicas by one container."""
    lib = SimulatedNvml(parse_spec("a100-40gbx3"))
    session = NvmlSession(lib)
    gpus = read_inventory(session).gpus
    for pid, gpu in ((10, "0"), (11, "1"), (12, "2")):
        lib.attach(gpu, pid, GIB, 0.5)
    holders: Holders = {
        gpus[0].uuid: Holder("llm", "vllm-0", "engine"),
        f"{gpus[1].uuid}::0": Holder("guard", "guard-a", "main"),
        f"{gpus[1].uuid}::1": Holder("guard", "guard-b", "main"),
        f"{gpus[2].uuid}::0": Holder("asr", "asr-0", "server"),
        f"{gpus[2].uuid}::1": Holder("asr", "asr-0", "server"),
    }
    agent = make_agent(session, lib.reset, allocations=lambda: holders)
    agent.refresh()
    return agent


def test_processes_are_placed_on_the_pod_holding_their_device() -> None:
    """A whole GPU or a slice held by one container names it; a GPU shared by replicas held by
    two containers names none (NVML does not say which container a pid is in)."""
    agent = _attributed_node()
    who = {k: (v["namespace"], v["pod"], v["container"]) for k, v in _info(agent).items()}
    assert who == {
        ("0", "10"): ("llm", "vllm-0", "engine"),
        ("1", "11"): ("", "", ""),
        ("2", "12"): ("asr", "asr-0", "server"),
    }
    assert _process(agent, "1", "11")["sm"] == 0.5


def documented_query() -> str:
    """README's "SM time per pod" query, as written there."""
    text = README.read_text()
    start = text.index("```promql\n", text.index("SM time per pod:")) + 10
    return " ".join(text[start : text.index("```", start)].split())


def test_the_documented_query_sums_sm_time_per_pod(tmp_path: Path) -> None:
    """README's query over this agent's series, evaluated by promtool (no server): a pod per
    attributed process, none for the shared GPU's."""
    agent = _attributed_node()
    series = [
        {"series": _selector(s.name, s.labels), "values": str(s.value)}
        for family in agent.registry.collect()
        if family.name.startswith("nodeagent_process_")
        for s in family.samples
    ]
    want = [
        {"labels": _selector("", {"namespace": ns, "pod": pod}), "value": 0.5}
        for ns, pod in sorted([("asr", "asr-0"), ("llm", "vllm-0")])
    ]
    test = {
        "rule_files": [],
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": documented_query(), "eval_time": "0m", "exp_samples": want}
                ],
            }
        ],
    }
    path = tmp_path / "query_test.yml"
    path.write_text(yaml.safe_dump(test))
    proc = subprocess.run(
        [prometheus_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def test_sim_attach_load_shows_in_nodeagent_metrics(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    sim = ("--simulate", "a100-40gb", "--sim-state", str(tmp_path / "node.json"))
    res = cli(*sim, "sim", "attach", "--device", "0", "--pid", "4242", "--load", "0.3")
    assert res.returncode == 0, res.stderr
    out = cli(*sim, "metrics")
    assert out.returncode == 0, out.stderr
    assert 'nodeagent_process_sm_utilization_ratio{gpu="0",pid="4242"} 0.3' in out.stdout
    assert 'nodeagent_process_memory_utilization_ratio{gpu="0",pid="4242"} 0.07' in out.stdout
