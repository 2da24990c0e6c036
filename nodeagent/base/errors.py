"""The nodeagent error hierarchy. The CLI maps each class to an exit code and one sentence."""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error nodeagent raises on purpose. `str(err)` is one readable sentence."""

    exit_code = 3


class ConfigError(AgentError):
    """Bad input: a config file, a flag, an environment variable, a simulate spec."""

    exit_code = 2


class NvmlError(AgentError):
    """NVML refused a call. `code` is NVML's numeric return code (e.g. NVML_ERROR_IN_USE = 19)."""

    exit_code = 3

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


class SliceInUse(MigError):
    """The requested change would destroy a slice that a process or pod holds."""


class GeometryInvalid(MigError):
    """The requested layout is not valid on the GPU model."""


class ModeChangePending(MigError):
    """A MIG mode change stayed pending (Ampere needs a GPU reset)."""


class ResetLeftToUser(ModeChangePending):
    """A MIG mode change stays pending because the user reset the GPU themselves
    (mig-parted's --skip-reset): theirs to do, no reboot needed."""


class RebootRequired(ModeChangePending):
    """A MIG mode change stays pending until the node reboots: the GPU reset that would apply
    it failed or is not offered (Ampere, pass-through VMs). `gpus`: the GPUs it waits on."""

    exit_code = 5

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


class KubeError(AgentError):
    """The Kubernetes API refused or could not be reached."""


class SimError(ConfigError):
    """The emulator was given a bad spec, a corrupt state file or an unknown device."""


class NothingMatched(AgentError):
    """A selection matched nothing (e.g. a config covers no GPU of this node)."""

    exit_code = 1


class LockHeld(AgentError):
    """Another process holds a lock nodeagent needs: the node's MIG writer lock (an agent or a
    `mig apply`), or a DRA plugin directory's (another agent)."""

    exit_code = 3
