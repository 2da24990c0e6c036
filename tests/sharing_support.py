"""An agent on an emulated node with a sharing config file and the fake MPS daemon, for the
per-GPU sharing tests (tests/integration/test_sharing_*.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nodeagent.agent import Agent
from nodeagent.mps.control import MpsControl
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.agent_support import make_agent


@contextlib.contextmanager
def sharing_node(
    tmp: Path, spec: str, configs: str, control: str, **groups: Mapping[str, Any]
) -> Iterator[tuple[Agent, SimulatedNvml]]:
    """The agent (sharing.config-file holding `configs`, MPS root in `tmp`), stopped after,
    with the fake daemon it may have left quit."""
    lib = SimulatedNvml(parse_spec(spec))
    (tmp / "sharing.yaml").write_text(configs)
    sharing = {"config_file": str(tmp / "sharing.yaml"), **groups.pop("sharing", {})}
    mps = {"root": tmp / "mps", "control": control, "stop_on_exit": True}
    agent = make_agent(NvmlSession(lib), lib.reset, sharing=sharing, mps=mps, **groups)
    try:
        yield agent, lib
    finally:
        agent.stop()
        daemon = MpsControl(control, tmp / "mps" / "pipe", tmp / "mps" / "log")
        if daemon.daemon_pid() is not None:
            daemon.command("quit")
