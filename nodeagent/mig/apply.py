"""Execute a MIG plan through nodeagent.nvml: each operation in order, a pending mode change
reset for its GPU only. A mode change that the reset cannot apply waits for a reboot: the other
GPUs' operations (their mode changes too, so that one reboot applies them all) still run, then
RebootRequired names the GPUs that wait. The sequence around it (observe, resolve, plan,
apply, verify) is the pipeline's (nodeagent.reconcile), for the agent and `mig apply` alike:
idempotent, and it converges after a failure or a kill at any mutation, because each run plans
from what NVML reports, including GIs left without their CI.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.base.commands import run_in_session
from nodeagent.base.errors import (
    Interrupted,
    ModeChangePending,
    NvmlError,
    RebootRequired,
    ResetLeftToUser,
    SliceInUse,
)
from nodeagent.base.logs import get_logger
from nodeagent.mig.plan import Op, Operation, Plan
from nodeagent.mig.profile import profile_or_none
from nodeagent.nvml import MigWriter, Placement
from nodeagent.nvml.codes import IN_USE

log = get_logger("nodeagent.mig")
DEFAULT_RESET_COMMAND = "nvidia-smi -r -i {index}"
Reset = Callable[[int], None]


@dataclass(frozen=True)
class Done:
    """One NVML operation done: the planned operation, the GPU and compute instance ids it
    acted on or got from NVML (a created GI's, a created CI's), whether the GPU was reset for
    a MIG mode change, and how long it took. On a dry run, a planned operation as it stands."""

    op: Operation
    gi_id: int | None = None
    ci_id: int | None = None
    reset: bool = False
    seconds: float = 0.0

    @classmethod
    def planned(cls, op: Operation) -> Done:
        return cls(op, op.gi_id, op.ci_id)

    def to_dict(self) -> dict[str, Any]:
        """As the JSON output writes it (`mig apply -o json`): the operation's fields, the ids
        it got, `reset` when the GPU was reset; not the time it took."""
        out = self.op.to_dict()
        if self.gi_id is not None:
            out["gi_id"] = self.gi_id
        if self.ci_id is not None:
            out["ci_id"] = self.ci_id
        if self.reset:
            out["reset"] = True
        return out


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
            # its own session: on timeout the whole group goes, a child it left included
            proc = run_in_session(
                args, timeout_seconds, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as err:  # not found, not executable: in the system's words, not Python's
            raise ModeChangePending(
                f"GPU {index}: MIG mode change is pending and the reset command {args[0]!r}"
                f" could not start: {err.strerror or 'it failed to start'}"
            ) from err
        except subprocess.TimeoutExpired as err:
            raise ModeChangePending(
                f"GPU {index}: MIG mode change is pending and the reset command {args[0]!r}"
                f" did not finish within {timeout_seconds:g} s (it was ended with its children)"
            ) from err
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise ModeChangePending(
                f"GPU {index}: MIG mode change is pending and the reset command"
                f" '{' '.join(args)}' failed (exit {proc.returncode})"
                + (f": {detail[-1]}" if detail else "")
            )

    return reset


class _Executor:
    def __init__(self, writer: MigWriter, reset: Reset, clock: Callable[[], float]) -> None:
        self.writer = writer
        self.reset = reset
        self.clock = clock
        self.new_gis: dict[tuple[int, Placement], int] = {}
        self.calls: dict[Op, Callable[[Operation], Done]] = {
            Op.SET_MIG_MODE: self._set_mig_mode,
            Op.DESTROY_CI: self._destroy_ci,
            Op.DESTROY_GI: self._destroy_gi,
            Op.CREATE_GI: self._create_gi,
            Op.CREATE_CI: self._create_ci,
        }

    def run(self, op: Operation) -> Done:
        log.info("mig.operation", **op.to_dict())
        began = self.clock()
        try:
            done = self.calls[op.op](op)
        except NvmlError as err:
            if err.code == IN_USE and op.op.destroys:
                raise SliceInUse(
                    f"GPU {op.gpu} slice {op.profile} (GI {op.gi_id}, placement {op.placement})"
                    " came into use during the change; NVML refused to destroy it"
                ) from err
            raise
        return replace(done, seconds=self.clock() - began)

    def _set_mig_mode(self, op: Operation) -> Done:
        assert op.enabled is not None
        result = self.writer.set_mig_mode(op.gpu, op.enabled)
        if result.current != op.enabled:
            if result.activation_status == IN_USE:
                raise ModeChangePending(
                    f"GPU {op.gpu}: MIG mode change to {'enabled' if op.enabled else 'disabled'}"
                    " is pending: processes are using the GPU; stop them and apply again"
                )
            wanted = "enabled" if op.enabled else "disabled"
            try:
                self.reset(op.gpu)
            except ResetLeftToUser:
                raise  # --skip-reset: the user resets the GPU; nothing waits for a reboot
            except (ModeChangePending, NvmlError) as err:
                raise RebootRequired(
                    f"GPU {op.gpu}: MIG mode {wanted} is pending until the node reboots ({err})",
                    (op.gpu,),
                ) from err
            current, pending = self.writer.mig_mode(op.gpu)
            if current != op.enabled:
                raise RebootRequired(
                    f"GPU {op.gpu}: MIG mode is still {'enabled' if current else 'disabled'}"
                    f" (pending {'enabled' if pending else 'disabled'}) after the GPU reset;"
                    " it takes effect when the node reboots",
                    (op.gpu,),
                )
            return Done(op, reset=True)
        return Done(op)

    def _destroy_ci(self, op: Operation) -> Done:
        assert op.gi_id is not None and op.ci_id is not None
        self.writer.destroy_compute_instance(op.gpu, op.gi_id, op.ci_id)
        return Done(op, op.gi_id, op.ci_id)

    def _destroy_gi(self, op: Operation) -> Done:
        assert op.gi_id is not None
        self.writer.destroy_gpu_instance(op.gpu, op.gi_id)
        return Done(op, op.gi_id)

    def _create_gi(self, op: Operation) -> Done:
        assert op.profile_id is not None and op.placement is not None
        gi_id = self.writer.create_gpu_instance(op.gpu, op.profile_id, op.placement)
        self.new_gis[(op.gpu, op.placement)] = gi_id
        return Done(op, gi_id)

    def _create_ci(self, op: Operation) -> Done:
        assert op.placement is not None and op.slice_count is not None
        gi_id = op.gi_id if op.gi_id is not None else self.new_gis[(op.gpu, op.placement)]
        gi = profile_or_none(op.profile or "")
        full = gi is None or op.slice_count == gi.g
        ci_id = self.writer.create_compute_instance(
            op.gpu, gi_id, op.slice_count, op.ci_start or 0, full=full
        )
        return Done(op, gi_id, ci_id)


def execute(
    the_plan: Plan,
    writer: MigWriter,
    reset: Reset,
    on_done: Callable[[Done], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], int] = lambda: 0,
) -> list[Done]:
    """Run every operation in order; returns what was done (each op with the ids it got and
    its duration on `clock`). `on_done` hears of each operation as soon as it is done
    (progress for a user watching); `stop` is asked before each one for a stop signal's
    number (0: go on). Raises RebootRequired (after the other GPUs' operations), SliceInUse,
    ModeChangePending, ResetLeftToUser, NvmlError, Interrupted (a stop signal)."""
    executor = _Executor(writer, reset, clock)
    done: list[Done] = []
    waiting: list[RebootRequired] = []  # GPUs whose mode waits for a reboot
    total = len(the_plan.operations)
    for op in the_plan.operations:
        if signum := stop():
            raise _interrupted(signum, len(done), total)
        if any(op.gpu in w.gpus for w in waiting):
            continue  # the rest of that GPU's change is planned again after the reboot
        try:
            done.append(executor.run(op))
        except RebootRequired as err:
            waiting.append(err)
            continue
        if on_done is not None:
            on_done(done[-1])
    if len(waiting) == 1:
        raise waiting[0]
    if waiting:
        gpus = tuple(g for w in waiting for g in w.gpus)
        raise RebootRequired(
            f"GPUs {', '.join(map(str, gpus))}: MIG mode changes are pending until the node"
            f" reboots (first: {waiting[0]})",
            gpus,
        )
    return done


def _interrupted(signum: int, done: int, total: int) -> Interrupted:
    name = signal.Signals(signum).name
    if not done:
        return Interrupted(f"stopped by {name} before the first of {total} NVML operations:"
                           " the MIG layout is unchanged", signum)  # fmt: skip
    return Interrupted(
        f"stopped by {name} after {done} of {total} NVML operations; the GPUs are between"
        " two configs: apply the config again to finish the change",
        signum,
    )


__all__ = ["Done", "command_reset", "execute"]
