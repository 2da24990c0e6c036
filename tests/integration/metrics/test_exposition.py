"""The exposition for known layouts (golden files), its lint, and what changes scrape to scrape."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from nodeagent.agent.service import Agent
from nodeagent.metrics.collectorset import CollectorSet
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import read_inventory
from nodeagent.nvml.codes import IN_USE
from nodeagent.sim import Fault, SimulatedNvml
from tests.support.metrics import prometheus_tool, sample
from tests.support.mig_apply import reconfigure

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
# Series whose values depend on the clock or the interpreter, not on the GPUs.
VOLATILE = re.compile(
    r"^nodeagent_(collector_duration_seconds|inventory_timestamp_seconds|build_info"
    r"|gpu_energy_joules_total|gpu_pcie_bytes_total)\b"
)

LAYOUTS = {
    "h200x2-balanced": (
        "h200x2",
        "all-balanced",
        [(0, "3g.71gb", 0.8), (0, "1g.18gb", 0.25), (1, "2g.35gb", 0.5)],
    ),
    "h200-mig-off": ("h200", None, [(0, "", 0.6)]),
    "a100-40gb-1g": ("a100-40gb", "all-1g.5gb", [(0, "1g.5gb", 1.0)]),
    "a30-balanced": ("a30", "all-balanced", []),
}


def exposition(agent: Agent) -> str:
    return generate_latest(agent.registry).decode()


def stable(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not VOLATILE.match(line))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_golden_exposition(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]], name: str
) -> None:
    spec, config, loads = LAYOUTS[name]
    agent, _ = agent_factory(spec, config, loads)
    got = stable(exposition(agent))
    path = GOLDEN / f"metrics-{name}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(got)
    assert got == path.read_text()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_promtool_check_metrics_is_clean(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]], name: str
) -> None:
    spec, config, loads = LAYOUTS[name]
    agent, _ = agent_factory(spec, config, loads)
    agent.reconcile()  # fill the agent's own series too
    proc = subprocess.run(
        [prometheus_tool("promtool"), "check", "metrics"],
        input=exposition(agent),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "" and proc.stderr.strip() == "", (
        proc.stdout + proc.stderr
    )


def test_gpm_follows_the_load(agent_factory: Callable[..., tuple[Agent, SimulatedNvml]]) -> None:
    agent, lib = agent_factory("h200", "all-balanced", [(0, "3g.71gb", 0.8)])
    text = exposition(agent)
    gi = next(
        s.gi_id for s in agent.store.snapshot.inventory.gpus[0].slices if s.profile == "3g.71gb"
    )  # type: ignore[union-attr]
    assert f'nodeagent_slice_sm_active_ratio{{gi_id="{gi}",gpu="0"}} 0.772' in text
    lib.detach(500)
    sample(agent)  # a window that spans the detach: about half
    assert f'nodeagent_slice_sm_active_ratio{{gi_id="{gi}",gpu="0"}} 0.386' in exposition(agent)
    sample(agent)
    assert f'nodeagent_slice_sm_active_ratio{{gi_id="{gi}",gpu="0"}} 0.0' in exposition(agent)


def test_destroyed_slices_disappear(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, lib = agent_factory("h200", "all-1g.18gb", [])
    before = exposition(agent)
    assert before.count("nodeagent_slice_info{") == 7
    cfg = parse_config(dump_config(generate_configs(read_inventory(agent.session))), "g")
    reconfigure(agent.session, cfg, "all-7g.141gb", lib.reset)
    sample(agent)
    after = exposition(agent)
    assert after.count("nodeagent_slice_info{") == 1 and 'profile="7g.141gb"' in after
    assert 'profile="1g.18gb"' not in after
    assert after.count("nodeagent_slice_sm_active_ratio{") == 1


def test_gpm_reseeds_when_a_gi_id_is_reused(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    # The driver's GI id follows the placement: a 3g at 0 and a 4g at 0 both get id 1.
    agent, lib = agent_factory("h200", "all-3g.71gb", [(0, "3g.71gb", 1.0)])
    assert agent.store.gpm.by_gi[(0, 1)]["sm_active"] > 0.9
    lib.detach(500)
    cfg = parse_config(dump_config(generate_configs(read_inventory(agent.session))), "g")
    reconfigure(agent.session, cfg, "all-4g.71gb", lib.reset)  # the new 4g GI gets id 1 again
    agent.refresh()
    agent.gpm.tick()
    assert (0, 1) not in agent.store.gpm.by_gi  # no value from the 7g's old sample
    agent.gpm.tick()  # too soon: still none
    assert (0, 1) not in agent.store.gpm.by_gi


def test_scrape_never_calls_nvml(agent_factory: Callable[..., tuple[Agent, SimulatedNvml]]) -> None:
    agent, lib = agent_factory("h200x2", "all-balanced", [])
    calls = lib.faults.calls
    for _ in range(5):
        exposition(agent)
    assert lib.faults.calls == calls


def test_one_failing_collector_does_not_fail_the_scrape(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    agent, _ = agent_factory("h200", None, [])

    class Broken:
        name = "broken"

        def collect(self) -> list[object]:
            raise RuntimeError("boom")

    (collector_set,) = [
        c for c in agent.registry._collector_to_names if isinstance(c, CollectorSet)
    ]
    collector_set.collectors.append(Broken())  # type: ignore[arg-type]
    text = exposition(agent)
    assert 'nodeagent_collector_success{collector="broken"} 0.0' in text
    assert 'nodeagent_collector_success{collector="gpus"} 1.0' in text
    assert "nodeagent_gpu_memory_total_bytes" in text


def test_reconcile_and_error_series(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]], tmp_path: Path
) -> None:
    agent, lib = agent_factory("h200", None, [])
    agent.reconcile()
    text = exposition(agent)
    assert 'nodeagent_reconciles_total{result="success"} 1.0' in text
    assert "nodeagent_last_reconcile_success_timestamp_seconds" in text
    assert "nodeagent_reconcile_duration_seconds_count 1.0" in text
    lib.faults.faults.append(Fault(function="nvmlDeviceGetMemoryInfo", error=IN_USE))
    agent.reconcile()
    value = agent.registry.get_sample_value
    assert value("nodeagent_reconciles_total", {"result": "failure"}) == 1.0
    assert value("nodeagent_nvml_errors_total", {"function": "nvmlDeviceGetMemoryInfo"}) == 1.0
    ok, reason = agent.ready()
    assert not ok and reason.startswith("observe: NVML nvmlDeviceGetMemoryInfo failed")
    steps = "nodeagent_reconcile_step_duration_seconds_count"
    assert value(steps, {"step": "observe"}) == 2.0
    assert value(steps, {"step": "resolve"}) == 1.0  # the failed run stopped at observe


def test_a_scrape_renders_once_per_change_and_shows_it(
    agent_factory: Callable[..., tuple[Agent, SimulatedNvml]],
) -> None:
    """The exposition is rendered on scrape, not after each sample: scrapes between two
    changes get the same bytes (the collectors' own durations included), the first scrape
    after a sample shows it."""
    agent, lib = agent_factory("h200", "all-1g.18gb", [])
    first = agent.exposition.latest()
    assert agent.exposition.latest() is first
    uuid = agent.store.snapshot.inventory.gpus[0].slices[0].mig_uuid  # type: ignore[union-attr]
    lib.attach(uuid or "", 4242, 1 << 30)
    assert agent.exposition.latest() is first  # the GPUs changed, but no sample says so yet
    agent.refresh()
    after = agent.exposition.latest().decode()
    assert 'nodeagent_slice_processes{ci_id="0",gi_id=' in after
    processes = [x for x in after.splitlines() if x.startswith("nodeagent_slice_processes{")]
    assert sorted(x.rsplit(" ", 1)[1] for x in processes) == ["0.0"] * 6 + ["1.0"]
