"""What MPS daemon the node should run, and whether it can: the MPS/MIG conflict policy. Pure,
except `check_startable`, which looks at the host (the control binary, the directories).

`mps_intent` validates the daemon against the GPUs as the wanted MIG config will leave them and
refuses MIG and MPS meeting on a GPU; `mps_daemon_settings` turns the `mps` settings group into
what the daemon is started with; `check_startable` is a start's prerequisites, checked in the
pipeline's plan step so that a daemon that cannot start fails the run before anything changed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.mps.layout import DEFAULT_RESOURCE, paths, read_plugin_config
from nodeagent.mps.manager import MpsChange, MpsIntent
from nodeagent.mps.settings import MpsSettings, parse_pinned, validate
from nodeagent.nvml.inventory import Inventory
from nodeagent.settings import Mps, Settings


def mps_layout(mps: Mps, kube_enabled: bool) -> str:
    if mps.layout != "auto":
        return mps.layout
    return "device-plugin" if kube_enabled else "flat"


def mps_daemon_settings(
    mps: Mps, devices: tuple[int, ...], kube_enabled: bool = False
) -> MpsSettings:
    """What the MPS daemon is started with, once its GPUs are known: the layout's paths, and
    the resource name and replicas of the device plugin's config when one is given. Raises
    ConfigError for a bad plugin config."""
    layout = mps_layout(mps, kube_enabled)
    resource, replicas = DEFAULT_RESOURCE, mps.replicas
    if mps.device_plugin_config is not None:
        plugin = read_plugin_config(mps.device_plugin_config)
        resource, replicas = plugin.resource, plugin.replicas
    where = paths(layout, mps.root, resource)
    exclusive = mps.exclusive_process
    return MpsSettings(
        devices=devices,
        replicas=replicas,
        thread_percentage=mps.thread_percentage,
        pinned_memory=parse_pinned(mps.pinned_memory, devices),
        pipe_dir=mps.pipe_dir or where.pipe_dir,
        log_dir=mps.log_dir or where.log_dir,
        ready_file=mps.ready_file or where.ready_file,
        control_binary=mps.control,
        exclusive_process=layout == "device-plugin" if exclusive is None else exclusive,
        probe_interval_seconds=mps.probe_interval_seconds,
        layout=layout,
        started_file=where.started_file,
        shm_dir=where.shm_dir,
        shm_size=mps.shm_size,
    )


def pipeline_pipe(settings: Settings) -> Path | None:
    """The pipe directory of the device-plugin path's daemon under `settings` (whichever
    process starts it), for a DRA claim's daemon to find it; None when a device plugin
    config that cannot be read leaves it unknown."""
    try:
        return mps_daemon_settings(settings.mps, (), settings.kube.enabled).pipe_dir
    except AgentError:
        return None


class MigMode(Protocol):
    """What a MIG config wants of one GPU (nodeagent.mig.select.MigTarget): only whether MIG
    is enabled matters here."""

    @property
    def mig_enabled(self) -> bool: ...


def _final_mig(inventory: Inventory, desired: Mapping[int, MigMode] | None) -> dict[int, bool]:
    """Per GPU: will MIG be enabled once the wanted config is applied?"""
    out = {}
    for gpu in inventory.gpus:
        wanted = desired.get(gpu.index) if desired else None
        out[gpu.index] = wanted.mig_enabled if wanted else gpu.mig_current or gpu.mig_pending
    return out


def mps_intent(
    settings: Settings,
    inventory: Inventory,
    desired: Mapping[int, MigMode] | None,
    mig_config: str | None,
    serving: tuple[int, ...] = (),
    moving: bool = False,
) -> MpsIntent | None:
    """The MPS daemon the node should run, validated against the GPUs as the MIG config will
    leave them. Raises ConfigError when MIG and MPS would meet on a GPU."""
    final = _final_mig(inventory, desired)
    what = f"MIG config {mig_config!r}" if mig_config else "MIG"
    # A sharing config that moves a GPU from MPS to MIG moves MPS first (`moving`); a MIG
    # config alone never takes a GPU from the daemon.
    problems = [
        f"{what} enables MIG on GPU {i}, which the running MPS daemon serves; stop MPS on it"
        " first (mps.devices) or pick a config that leaves it whole"
        for i in serving
        if desired and i in desired and desired[i].mig_enabled and not moving
    ]
    mps = settings.mps
    if not mps.enabled:
        if problems:
            raise ConfigError("; ".join(problems))
        return None
    devices = mps.devices or tuple(i for i, mig in sorted(final.items()) if not mig)
    problems += [
        f"{what} enables MIG on GPU {i}, which mps.devices puts under MPS"
        for i in devices
        if final.get(i) and i not in serving and desired and i in desired
    ]
    if not devices and not problems:
        problems.append("MPS is enabled but every GPU has MIG enabled; no GPU is left for MPS")
    if problems:
        raise ConfigError("; ".join(problems))
    as_planned = dataclasses.replace(
        inventory,
        gpus=tuple(
            dataclasses.replace(g, mig_current=final[g.index], mig_pending=final[g.index])
            for g in inventory.gpus
        ),
    )
    daemon = mps_daemon_settings(mps, devices, settings.kube.enabled)
    return MpsIntent(daemon, validate(daemon, as_planned))


def _creatable(folder: Path) -> str | None:
    """Why `folder` cannot be made (or used) by this process; None when it can."""
    probe = folder
    while not probe.exists():
        if probe.is_symlink():
            return f"{probe} is a dangling symbolic link"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if probe != folder:
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
    elif not os.access(probe, os.R_OK | os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def check_startable(change: MpsChange) -> None:
    """A start (or restart, or a change of limits: the control program sets them) of the MPS
    daemon can happen: the control binary is an executable file, and the pipe and log
    directories exist or can be made. Raises ConfigError (exit 2): what is missing is the
    node's setup or a setting (mps.control, mps.pipe-dir), and nothing has changed yet."""
    if change.action not in ("start", "restart", "limits") or change.intent is None:
        return
    s = change.intent.settings
    binary = s.control_binary
    found = shutil.which(binary) if os.sep not in binary else binary
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        where = "on PATH" if os.sep not in binary else "there"
        raise ConfigError(
            f"the MPS daemon cannot start: its control program {binary!r} is not an executable"
            f" file {where} (install the NVIDIA driver's MPS tools or set mps.control)"
        )
    for folder, what in ((s.pipe_dir, "pipe"), (s.log_dir, "log")):
        problem = _creatable(folder)
        if problem is not None:
            raise ConfigError(
                f"the MPS daemon cannot start: its {what} directory {folder} cannot be made"
                f" ({problem})"
            )
