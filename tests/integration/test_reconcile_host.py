"""The pipeline's host duties without Kubernetes (bare metal, `nodeagent run` under systemd;
`mig apply`): a command's reboot runs once per process however often the mode still waits, an
agent without the node label never reboots, and the CDI refresh comes after a change only
(nodeagent.host.duties)."""

from __future__ import annotations

import time
from pathlib import Path

from nodeagent.agent.factory import agent_pipeline, command_pipeline
from nodeagent.metrics.agent import AgentStats
from nodeagent.mps.manager import MpsManager
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Store
from tests.support.agent import make_settings
from tests.support.host import fake_command, recorded


def test_the_reboot_command_runs_once_per_process(tmp_path: Path) -> None:
    lib = SimulatedNvml(parse_spec("a100-40gbx2:no-reset"))
    script = fake_command(tmp_path, "reboot")
    mig = {"config": "all-enabled", "with_reboot": True, "reboot_command": f"{script} now"}
    pipeline = command_pipeline(NvmlSession(lib), make_settings(mig=mig), lib.reset, None)
    first, second = pipeline.run_once(), pipeline.run_once()
    assert first.reboot_required and second.reboot_required
    assert first.step == "apply" and "pending until the node reboots" in (first.reason or "")
    assert recorded(script) == ["reboot now"]
    lib.reboot()
    again = command_pipeline(NvmlSession(lib), make_settings(mig=mig), lib.reset, None)
    assert again.run_once().result == "success"
    assert recorded(script) == ["reboot now"]


def test_a_cdi_refresh_follows_each_change_and_nothing_else(tmp_path: Path) -> None:
    lib = SimulatedNvml(parse_spec("h200x2"))
    ctk = fake_command(tmp_path, "ctk")
    mig = {"cdi_refresh": True, "cdi_commands": (f"{ctk} one", f"{ctk} two")}
    for name, runs in (("all-balanced", 2), ("all-balanced", 2), ("all-7g.141gb", 4)):
        settings = make_settings(mig={**mig, "config": name})
        report = command_pipeline(NvmlSession(lib), settings, lib.reset, None).run_once()
        assert report.result == "success", report.reason
        assert len(recorded(ctk)) == runs, name
    assert recorded(ctk) == ["ctk one", "ctk two"] * 2
    dry = make_settings(mig={**mig, "config": "all-disabled"})
    assert command_pipeline(NvmlSession(lib), dry, lib.reset, None).run_once(dry_run=True).done
    assert len(recorded(ctk)) == 4  # a dry run changes nothing, refreshes nothing


def test_an_agent_without_the_node_label_never_reboots(tmp_path: Path) -> None:
    """Bare metal: no state label remembers the reboot, so the agent would reboot again at each
    boot where the mode stays pending; it reports the wait and leaves the reboot to the admin."""
    lib = SimulatedNvml(parse_spec("a100-40gb:no-reset"))
    session = NvmlSession(lib)
    script = fake_command(tmp_path, "reboot")
    mig = {"config": "all-enabled", "with_reboot": True, "reboot_command": str(script)}
    settings = make_settings(mig=mig)
    pipeline = agent_pipeline(
        Store(session, time.time), lambda: settings, lambda _s: lib.reset, None,
        MpsManager(ComputeModeWriter(session)), AgentStats(),
    )  # fmt: skip
    report = pipeline.run_once()
    assert report.reboot_required and recorded(script) == []
