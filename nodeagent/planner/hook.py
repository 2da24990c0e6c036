"""The agent's use of the planner: a workload file becomes a sharing config the pipeline applies
as it applies a named one. Planned again only when the file or the node's GPUs change, so slices
that the planned workloads come to use do not move the plan; the file is rewritten only when
the plan changed (the pipeline reads it again only then)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from nodeagent.base.configfile import ConfigCache
from nodeagent.base.errors import AgentError
from nodeagent.base.files import write_if_changed
from nodeagent.base.logs import get_logger
from nodeagent.nvml.inventory import Inventory
from nodeagent.planner.planner import plan_node
from nodeagent.planner.render import render_yaml
from nodeagent.planner.workloads import WorkloadFile, load_workloads
from nodeagent.settings import Node

PLANNED = "planned"
FILE_NAME = "planned-sharing.yaml"
log = get_logger("nodeagent.planner")


def planned_path(node: Node) -> Path | None:
    """Where the planned sharing config goes: the run directory (`node.run-dir`); under
    --simulate beside the emulator's state file (`.STATE.planned-sharing.yaml`, as the MIG
    writer lock is `.STATE.lock`), never the host's run directory; None for an emulator without
    a state file (it lives in one process: the planner keeps the file in a folder of its own)."""
    if node.simulate:
        state = node.sim_state
        return None if state is None else state.with_name(f".{state.name}.{FILE_NAME}")
    return node.run_dir / FILE_NAME


class WorkloadPlanner:
    def __init__(self) -> None:
        self.files: ConfigCache[WorkloadFile] = ConfigCache(load_workloads, "workload file")
        self._planned: tuple[WorkloadFile, tuple[tuple[int, str, int], ...], Path] | None = None
        self._own: tempfile.TemporaryDirectory[str] | None = None  # removed at exit

    def sharing_file(self, workload_file: str, inventory: Inventory, path: Path | None) -> Path:
        """The planned sharing config file (config name `planned`) for this node, written at
        `path` (planned_path; None: in a temporary folder of this planner's). Raises
        ConfigError (the workload file) or AgentError (the file could not be written)."""
        workloads = self.files.load(workload_file)
        gpus = tuple((g.index, g.uuid, g.pci_device_id) for g in inventory.gpus)
        if path is None:
            if self._own is None:
                self._own = tempfile.TemporaryDirectory(prefix="nodeagent-planned-")
            path = Path(self._own.name) / FILE_NAME
        last = self._planned
        if last and last[0] is workloads and last[1] == gpus and last[2] == path and path.exists():
            return path
        plan = plan_node(inventory, workloads.workloads)
        text = render_yaml(plan, PLANNED)
        try:
            write_if_changed(path, text, "the planned sharing config")
        except OSError as err:
            raise AgentError(f"cannot write the planned sharing config {path}: {err}") from err
        log.info(
            "plan.planned",
            workloads=workloads.source,
            path=str(path),
            gpus_used=plan.gpus_used,
            replicas_placed=len(plan.placed),
            not_placed=sum(n.replicas for n in plan.not_placed),
        )
        self._planned = (workloads, gpus, path)
        return path
