"""An agent on an emulated node with a sharing config file and the fake MPS daemon, for the
per-GPU sharing tests (tests/integration/test_sharing_*.py)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nodeagent.agent.service import Agent
from nodeagent.mps.control import MpsControl
from nodeagent.mps.layout import DEVICE_PLUGIN, FLAT, is_mounted, paths
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent


@contextlib.contextmanager
def sharing_node(
    tmp: Path,
    spec: str,
    configs: str,
    control: str,
    plugin_layout: bool = False,
    **groups: Mapping[str, Any],
) -> Iterator[tuple[Agent, SimulatedNvml]]:
    """The agent (sharing.config-file holding `configs`; MPS in `tmp`, or with `plugin_layout`
    in the device plugin's layout under a short root of its own), stopped after, with the fake
    daemon it may have left quit and the root's tmpfs unmounted."""
    lib = SimulatedNvml(parse_spec(spec))
    (tmp / "sharing.yaml").write_text(configs)
    sharing = {"config_file": str(tmp / "sharing.yaml"), **groups.pop("sharing", {})}
    # A short root in the plugin's layout: the daemon's sockets live in <root>/<resource>/pipe.
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp")) if plugin_layout else tmp / "mps"
    layout = DEVICE_PLUGIN if plugin_layout else FLAT
    mps = {"root": root, "control": control, "stop_on_exit": True, "layout": layout}
    agent = make_agent(NvmlSession(lib), lib.reset, sharing=sharing, mps=mps, **groups)
    try:
        yield agent, lib
    finally:
        agent.stop()
        where = paths(layout, root)
        daemon = MpsControl(control, where.pipe_dir, where.log_dir)
        if daemon.daemon_pid() is not None:
            daemon.command("quit")
        if plugin_layout:
            if is_mounted(root / "shm"):  # the agent mounted the tmpfs (tests run as root)
                subprocess.run(["umount", str(root / "shm")], check=False, timeout=30)
            shutil.rmtree(root, ignore_errors=True)
