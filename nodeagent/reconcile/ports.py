"""What goes in and out of the pipeline: the wanted config (from a desire source), the report
(to a reporter), and the ports the outside plugs in (GPU clients, label sinks)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.base.errors import RebootRequired
from nodeagent.mig.apply import Done
from nodeagent.settings import Settings
from nodeagent.state.snapshot import Snapshot

STEPS = (
    "observe",
    "desire",
    "resolve",
    "plan",
    "pause",
    "apply",
    "verify",
    "cdi",
    "restore",
    "publish",
    "report",
    "reboot",
)
# A failure in these steps is the wanted config's failure (state label "failed"); one in
# observe is the node's (retried, nothing reported against the config).
CONFIG_STEPS = frozenset(
    {"desire", "resolve", "plan", "pause", "apply", "verify", "cdi", "restore", "reboot"}
)


@dataclass(frozen=True)
class Wanted:
    """What a source asks for. `tracked`: the source expects a state report (node label)."""

    origin: str  # "settings" | "node-label"
    mig_config: str | None
    tracked: bool = False
    sharing_config: str | None = None  # a per-GPU sharing config (nodeagent/v1)
    # The state said `rebooting` when asked: a MIG mode change that still waits for a reboot
    # now fails, and is not rebooted for again (mig-manager's "did not take effect").
    after_reboot: bool = False
    # The device plugin config the node label names (labels.device-plugin-config-label);
    # the labels follow it (nodeagent.labels.devicepluginconfig). Never a change of the GPUs.
    device_plugin_config: str | None = None


class DesireSource(Protocol):
    def wanted(self, settings: Settings) -> Wanted: ...


class SettingsDesire:
    """Bare metal: the MIG config name of the settings (flags, environment, file)."""

    def wanted(self, settings: Settings) -> Wanted:
        return Wanted("settings", settings.mig.config, sharing_config=settings.sharing.config)


class Clients(Protocol):
    def pause(self) -> None: ...
    def restore(self) -> None: ...


class LabelSink(Protocol):
    name: str

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None: ...


@dataclass(frozen=True)
class Report:
    result: str  # success | failure
    wanted: Wanted
    step: str | None = None  # the step that failed
    reason: str | None = None  # "<step>: <error>"
    operations: int = 0  # NVML operations done
    mps_change: str = "none"
    generation: int = 0
    done: tuple[Done, ...] = ()  # the NVML operations (planned ones on a dry run)
    sharing: dict[int, tuple[str, int]] = field(default_factory=dict)  # GPU -> (strategy, n)
    error: BaseException | None = field(default=None, compare=False, repr=False)
    # A dry run of a MIG config: how the GPUs differ from it (empty when they match).
    differences: tuple[str, ...] = ()

    @property
    def config_failed(self) -> bool:
        return self.step in CONFIG_STEPS

    @property
    def reboot_required(self) -> bool:
        """A MIG mode change waits for the node to reboot (state label `rebooting`), and did
        not wait for one already (then it is a failure like any other)."""
        return isinstance(self.error, RebootRequired) and not self.wanted.after_reboot


class Reporter(Protocol):
    def changing(self, wanted: Wanted, operations: int) -> None: ...
    def finished(self, report: Report) -> None: ...


class Stops(Protocol):
    """A command's stop signals (nodeagent.cli.stops) while it changes the node: `deferred()`
    holds them off from the MIG writer lock taken to its release, `requested()` is asked
    between NVML operations (the signal's number, 0: none)."""

    def deferred(self) -> AbstractContextManager[None]: ...

    def requested(self) -> int: ...
