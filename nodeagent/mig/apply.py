"""Execute a MIG plan through nodeagent.nvml, then read the GPUs again and verify.

`reconfigure()` is the whole sequence as named steps (observe, resolve, plan, apply, verify):
nothing touches a GPU until the config is valid and every GPU is planned. It is idempotent
and converges after a failure or a kill at any mutation, because each run plans from what
NVML reports, including GIs left without their CI.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.errors import MigError, ModeChangePending, NvmlError, SliceInUse
from nodeagent.logs import get_logger
from nodeagent.mig.config import MigConfigFile
from nodeagent.mig.plan import Operation, Plan, mismatches, plan
from nodeagent.mig.profile import profile_or_none
from nodeagent.mig.select import Desired, covered, resolve
from nodeagent.nvml import Inventory, MigWriter, NvmlSession, Placement, read_inventory

log = get_logger("nodeagent.mig")
IN_USE = 19
DEFAULT_RESET_COMMAND = "nvidia-smi -r -i {index}"
Reset = Callable[[int], None]


def command_reset(template: str = DEFAULT_RESET_COMMAND, timeout_seconds: float = 300) -> Reset:
    """A reset function that runs `template` with {index} replaced, for that GPU only.

    The command is split like a shell would but run without one. Raises ModeChangePending
    when it fails or times out.
    """
    argv = shlex.split(template)
    if not argv:
        raise ValueError("empty reset command")

    def reset(index: int) -> None:
        args = [a.replace("{index}", str(index)) for a in argv]
        log.info("mig.reset", gpu=index, command=" ".join(args))
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_seconds)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ModeChangePending(
                f"GPU {index}: reset command {args[0]!r} failed: {err}"
            ) from err
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise ModeChangePending(
                f"GPU {index}: MIG mode change is pending and the reset command"
                f" '{' '.join(args)}' failed (exit {proc.returncode})"
                + (f": {detail[-1]}" if detail else "")
            )

    return reset


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    done: tuple[dict[str, Any], ...]
    inventory: Inventory
    desired: Mapping[int, Desired]


class _Executor:
    def __init__(self, writer: MigWriter, reset: Reset) -> None:
        self.writer = writer
        self.reset = reset
        self.new_gis: dict[tuple[int, Placement], int] = {}

    def run(self, op: Operation) -> dict[str, Any]:
        log.info("mig.operation", **op.to_dict())
        try:
            return getattr(self, "_" + op.op.replace("-", "_"))(op)  # type: ignore[no-any-return]
        except NvmlError as err:
            if err.code == IN_USE and op.op.startswith("destroy"):
                raise SliceInUse(
                    f"GPU {op.gpu} slice {op.profile} (GI {op.gi_id}, placement {op.placement})"
                    " came into use during the change; NVML refused to destroy it"
                ) from err
            raise

    def _set_mig_mode(self, op: Operation) -> dict[str, Any]:
        assert op.enabled is not None
        result = self.writer.set_mig_mode(op.gpu, op.enabled)
        if result.current != op.enabled:
            if result.activation_status == IN_USE:
                raise ModeChangePending(
                    f"GPU {op.gpu}: MIG mode change to {'enabled' if op.enabled else 'disabled'}"
                    " is pending: processes are using the GPU; stop them and apply again"
                )
            self.reset(op.gpu)
            current, pending = self.writer.mig_mode(op.gpu)
            if current != op.enabled:
                raise ModeChangePending(
                    f"GPU {op.gpu}: MIG mode is still {'enabled' if current else 'disabled'}"
                    f" (pending {'enabled' if pending else 'disabled'}) after the GPU reset"
                )
            return {**op.to_dict(), "reset": True}
        return op.to_dict()

    def _destroy_ci(self, op: Operation) -> dict[str, Any]:
        assert op.gi_id is not None and op.ci_id is not None
        self.writer.destroy_compute_instance(op.gpu, op.gi_id, op.ci_id)
        return op.to_dict()

    def _destroy_gi(self, op: Operation) -> dict[str, Any]:
        assert op.gi_id is not None
        self.writer.destroy_gpu_instance(op.gpu, op.gi_id)
        return op.to_dict()

    def _create_gi(self, op: Operation) -> dict[str, Any]:
        assert op.profile_id is not None and op.placement is not None
        gi_id = self.writer.create_gpu_instance(op.gpu, op.profile_id, op.placement)
        self.new_gis[(op.gpu, op.placement)] = gi_id
        return {**op.to_dict(), "gi_id": gi_id}

    def _create_ci(self, op: Operation) -> dict[str, Any]:
        assert op.placement is not None and op.slice_count is not None
        gi_id = op.gi_id if op.gi_id is not None else self.new_gis[(op.gpu, op.placement)]
        gi = profile_or_none(op.profile or "")
        full = gi is None or op.slice_count == gi.g
        ci_id = self.writer.create_compute_instance(
            op.gpu, gi_id, op.slice_count, op.ci_start or 0, full=full
        )
        return {**op.to_dict(), "gi_id": gi_id, "ci_id": ci_id}


def execute(
    the_plan: Plan,
    writer: MigWriter,
    reset: Reset,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every operation in order; returns what was done (each op with the ids it got).
    `on_done` hears of each operation as soon as it is done (progress for a user watching)."""
    executor = _Executor(writer, reset)
    done = []
    for op in the_plan.operations:
        done.append(executor.run(op))
        if on_done is not None:
            on_done(done[-1])
    return done


def reconfigure(
    session: NvmlSession,
    cfg: MigConfigFile,
    name: str,
    reset: Reset,
    in_use: Mapping[str, str] | None = None,
    dry_run: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> Outcome:
    """Bring the node to config `name` of `cfg`. Raises ConfigError, NothingMatched,
    SliceInUse, GeometryInvalid, ModeChangePending, NvmlError, or MigError when the GPUs
    read back differ from what was asked."""

    def step(name_: str) -> None:
        log.debug("mig.step", step=name_)
        if on_step:
            on_step(name_)

    step("observe")
    inventory = read_inventory(session)
    step("resolve")
    desired = resolve(cfg, name, inventory)
    step("plan")
    the_plan = plan(inventory, desired, in_use)
    if dry_run:
        return Outcome(the_plan, (), inventory, desired)
    step("apply")
    done = execute(the_plan, MigWriter(session), reset, on_done)
    step("verify")
    after = read_inventory(session)
    problems = mismatches(after, desired)
    if problems:
        raise MigError("after applying, the GPUs do not match: " + "; ".join(problems))
    log.info("mig.applied", config=name, operations=len(done))
    return Outcome(the_plan, tuple(done), after, desired)


def assert_config(
    session: NvmlSession, cfg: MigConfigFile, name: str
) -> tuple[list[str], Mapping[int, Desired]]:
    """The differences between the node and config `name` (empty when they match). As
    mig-parted asserts, a GPU that no entry of the config selects is a difference."""
    inventory = read_inventory(session)
    desired = resolve(cfg, name, inventory)
    selected = covered(cfg, name, inventory)
    missing = [
        f"GPU {g.index} ({g.name}): config {name!r} does not specify it"
        for g in inventory.gpus
        if g.index not in selected
    ]
    return mismatches(inventory, desired) + missing, desired


__all__ = ["Outcome", "assert_config", "command_reset", "execute", "reconfigure"]
