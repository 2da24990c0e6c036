"""What mig-manager does on the host around a MIG change, besides the change itself
(NVIDIA/mig-parted bd7160f4, pkg/mig/reconfigure/reconfigure.go):

- CDI refresh: after a MIG change, before the state says success, the commands of
  `mig.cdi-commands` (mig-manager: `nvidia-ctk system create-device-nodes --control-devices`,
  then `nvidia-ctk cdi generate --mode=management ...`), when `mig.cdi-refresh` is on
  (its CDI_ENABLED, which the GPU operator sets by default).
- Reboot: when a MIG mode change waits for a reboot (an Ampere GPU whose reset failed or is
  not offered), and `mig.with-reboot` is on (its WITH_REBOOT, off by default), the
  `mig.reboot-command` once the state label says `rebooting`.

Commands are split as a shell would and run without one, with the agent's environment.
"""

from __future__ import annotations

import shlex
import subprocess

from nodeagent.base.commands import run_in_session
from nodeagent.base.errors import AgentError
from nodeagent.base.logs import get_logger
from nodeagent.settings import Settings

log = get_logger("nodeagent.host.duties")
OUTPUT_TAIL = 300  # characters of a failed command's output kept in its reason


class HostDutyError(AgentError):
    """A host command (CDI refresh, reboot) could not start, failed or timed out."""

    exit_code = 3


def run_command(line: str, what: str, timeout_seconds: float) -> None:
    """Run one command line; raises HostDutyError naming `what`, the command and its output's
    last line when it cannot start, exits non-zero or outlives `timeout_seconds`."""
    argv = shlex.split(line)
    try:
        proc = run_in_session(
            argv, timeout_seconds, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    except OSError as err:
        raise HostDutyError(f"{what} '{line}' could not start: {err.strerror or err}") from err
    except subprocess.TimeoutExpired as err:
        raise HostDutyError(f"{what} '{line}' did not finish within {timeout_seconds:g} s") from err
    lines = (proc.stdout or "").strip().splitlines()
    if proc.returncode != 0:
        how = (
            f"was killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"exited with {proc.returncode}"
        )
        tail = lines[-1][-OUTPUT_TAIL:] if lines else ""
        raise HostDutyError(f"{what} '{line}' {how}" + (f": {tail}" if tail else ""))
    log.info("host.command", duty=what, command=line, output=" | ".join(lines[-3:]))


def refresh_cdi(settings: Settings) -> int:
    """After a MIG change: run `mig.cdi-commands` in order when `mig.cdi-refresh` is on;
    returns how many ran. Raises HostDutyError at the first that fails."""
    mig = settings.mig
    if not mig.cdi_refresh:
        return 0
    for line in mig.cdi_commands:
        run_command(line, "the CDI refresh command", mig.hook_timeout_seconds)
    return len(mig.cdi_commands)


def reboot(settings: Settings) -> None:
    """Reboot the node with `mig.reboot-command` (the caller checked `mig.with-reboot` and
    wrote the `rebooting` state first). Raises HostDutyError when the command fails."""
    log.warning("host.reboot", command=settings.mig.reboot_command)
    run_command(
        settings.mig.reboot_command, "the reboot command", settings.mig.hook_timeout_seconds
    )
