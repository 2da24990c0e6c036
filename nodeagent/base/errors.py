"""The nodeagent error hierarchy. The CLI maps each class to an exit code and one sentence.

Each class says its consequence and its reason:
- `retry`: True when the same call may succeed later unchanged (a lock another holds, an API
  server or daemon down, a deadline passed, the agent stopping); False when it was refused as
  given (bad input, a layout the GPU cannot have) and only a change of the input helps.
- `reason`: a short name for the class of failure, the one the metrics count by
  (`nodeagent_dra_refusals_total{reason}`) and the CLI's `--output json` failures carry.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error nodeagent raises on purpose. `str(err)` is one readable sentence."""

    exit_code = 3
    reason = "other"
    retry = False


class ConfigError(AgentError):
    """Bad input: a config file, a flag, an environment variable, a simulate spec, a claim."""

    exit_code = 2
    reason = "bad-input"


class NvmlError(AgentError):
    """NVML refused a call. `code` is NVML's numeric return code (e.g. NVML_ERROR_IN_USE = 19)."""

    exit_code = 3
    reason = "nvml"

    def __init__(self, code: int, function: str, message: str, context: str = "") -> None:
        self.code = code
        self.function = function
        self.nvml_message = message
        self.context = context
        where = f" ({context})" if context else ""
        super().__init__(f"NVML {function} failed{where}: {message} (NVML error {code})")


class MigError(AgentError):
    """A MIG reconfiguration could not be done."""

    exit_code = 3
    reason = "mig"


class SliceInUse(MigError):
    """The requested change would destroy a slice that a process or pod holds."""

    reason = "in-use"
    retry = True  # the holder may let go


class GeometryInvalid(MigError):
    """The requested layout cannot be had on the GPU (its model's rules, or the slices others
    hold there)."""

    reason = "in-use"


class ModeChangePending(MigError):
    """A MIG mode change stayed pending (Ampere needs a GPU reset)."""

    reason = "mode-pending"
    retry = True


class ResetLeftToUser(ModeChangePending):
    """A MIG mode change stays pending because the user reset the GPU themselves
    (mig-parted's --skip-reset): theirs to do, no reboot needed."""


class RebootRequired(ModeChangePending):
    """A MIG mode change stays pending until the node reboots: the GPU reset that would apply
    it failed or is not offered (Ampere, pass-through VMs). `gpus`: the GPUs it waits on."""

    exit_code = 5
    reason = "reboot"

    def __init__(self, message: str, gpus: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.gpus = gpus


class Interrupted(MigError):
    """A stop signal (SIGINT, SIGTERM) ended a MIG change between two NVML operations: the
    lock released and the hooks' apply-exit run as after any failure. Exit 128 + the signal's
    number, as a shell reports a command that signal ended."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class MpsError(AgentError):
    """The MPS control daemon could not be started, configured or reached."""

    reason = "mps"
    retry = True


class KubeError(AgentError):
    """Kubernetes refused or could not be reached: the API server, or the kubelet's own APIs
    (pod-resources). Not for our own sockets, locks or deadlines (their classes below)."""

    reason = "api"
    retry = True


class SimError(ConfigError):
    """The emulator was given a bad spec, a corrupt state file or an unknown device."""


class NothingMatched(AgentError):
    """A selection matched nothing (a config that covers no GPU of this node, say)."""

    exit_code = 1
    reason = "nothing-matched"


class LockError(AgentError):
    """A lock file nodeagent needs could not be taken (not a holder: the file itself)."""

    reason = "lock"


class LockHeld(LockError):
    """Another process holds a lock nodeagent needs: the node's MIG writer lock (an agent or a
    `mig apply`), or a DRA plugin directory's (another agent)."""

    exit_code = 3
    retry = True


class SocketError(AgentError):
    """A unix socket of our own could not be listened on or served (the DRA plugin's)."""

    reason = "socket"
    retry = True


class DeadlineExceeded(AgentError):
    """The time a caller gave us ran out (the kubelet's deadline of a prepare)."""

    reason = "deadline"
    retry = True


class Stopping(AgentError):
    """The agent is stopping: the work was not done and is not tried again here."""

    reason = "stopping"
    retry = True


def shown(value: object) -> str:
    """`value` for a sentence: repr'd, at most 64 characters of it (a value from a file or an
    answer can be any length)."""
    text = repr(value)
    return text if len(text) <= 64 else text[:63] + "…"
