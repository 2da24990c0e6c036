"""The reconcile pipeline: one straight list of named steps, run on one worker.

    observe  read every GPU into a new Snapshot (and which devices pods hold)
    desire   what is wanted: the MIG config name (settings, or the node label
             nvidia.com/mig.config) and its file (parsed again only when it changed), MPS;
             with none named and a workload file set, the sharing config planned from it
    resolve  per GPU: the MIG state the config asks for, and the MPS daemon (GPUs, limits);
             MIG on a GPU under MPS (and MPS on a GPU that will have MIG) is refused here
             (nodeagent.mps.intent)
    plan     the fewest NVML operations (pure), and the one MPS change; then every
             prerequisite of the change: the hooks file, the MPS control program and
             directories a daemon start needs
    pause    only when something changes: take the node-wide MIG writer lock (held to the
             end of restore); for a MIG operation report "pending", run the apply-start hook,
             pause the GPU clients, run the pre-apply-mode / pre-apply-config hooks
    apply    under the NVML lock: read again, plan again, execute; then converge the MPS
             daemon
    verify   read again; the GPUs must match the config, the MPS limits must read back
    cdi      after a MIG change, with mig.cdi-refresh: the CDI refresh commands
             (nodeagent.host.duties), before the clients are back and the state says success
    restore  the apply-exit hook, then GPU clients back (always, whatever failed after the
             apply-start hook ran or the clients were paused)
    publish  labels to every sink (the device plugin's config is one), all from the one
             snapshot the run ends with
    report   state label, reason annotation and Events (node label protocol), metrics,
             readiness
    reboot   only when a MIG mode change waits for a reboot (state `rebooting` written) and
             mig.with-reboot is on: the reboot command

Nothing changes before resolve and plan succeeded for the whole node. Every failure is
reported as `<step>: <reason>` (`resolve: mig.yaml: no config named 'x'`), and each step's
duration is a sample of `nodeagent_reconcile_step_duration_seconds{step}`, taken when the run
ends. Collaborators come in through the constructor (nodeagent.agent.factory builds the
agent's and a command's), so the whole pipeline runs in a unit test on the emulator with
fakes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nodeagent.reconcile.pipeline import Pipeline, mig_config_cache
from nodeagent.reconcile.ports import (
    CONFIG_STEPS,
    STEPS,
    Clients,
    DesireSource,
    LabelSink,
    Report,
    Reporter,
    SettingsDesire,
    Stops,
    Wanted,
)
from nodeagent.settings import Settings


@contextlib.contextmanager
def no_lock(_settings: Settings) -> Iterator[None]:
    """No MIG writer lock (an emulator in one process, a test)."""
    yield


__all__ = [
    "CONFIG_STEPS",
    "STEPS",
    "Clients",
    "DesireSource",
    "LabelSink",
    "Pipeline",
    "Report",
    "Reporter",
    "SettingsDesire",
    "Stops",
    "Wanted",
    "mig_config_cache",
    "no_lock",
]
