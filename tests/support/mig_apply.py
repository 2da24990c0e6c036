"""MIG changes for tests, through the one orchestrator: `reconfigure` brings an emulated node
to a config of an already parsed file as `nodeagent mig apply` does (a command's pipeline),
and raises what the run failed with."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.agent.factory import command_pipeline
from nodeagent.base.configfile import ConfigCache
from nodeagent.mig.apply import Done, Reset
from nodeagent.mig.config import MigConfigFile
from nodeagent.mig.select import MigTarget, resolve
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.state.snapshot import Holder


@dataclass(frozen=True)
class Outcome:
    done: tuple[Done, ...]  # the NVML operations, each with the ids it got
    inventory: Inventory  # the GPUs after the run
    desired: Mapping[int, MigTarget]


def reconfigure(
    session: NvmlSession,
    cfg: MigConfigFile,
    name: str,
    reset: Reset,
    in_use: Mapping[str, str] | None = None,
) -> Outcome:
    """Apply config `name` of `cfg`; `in_use`: {device UUID: 'pod NAMESPACE/NAME'} held by
    pods. Raises the run's error (ConfigError, SliceInUse, NvmlError...)."""
    settings = Settings()
    settings = dataclasses.replace(
        settings, mig=dataclasses.replace(settings.mig, config_file="-", config=name)
    )
    holders = {
        uuid: Holder(*pod.removeprefix("pod ").split("/", 1), "")
        for uuid, pod in (in_use or {}).items()
    }
    pipeline = command_pipeline(
        session,
        settings,
        reset,
        None,
        configs=ConfigCache(lambda _path: cfg, "MIG config file"),
        allocations=(lambda: holders) if in_use is not None else None,
    )
    report = pipeline.run_once()
    if report.error is not None:
        raise report.error
    inventory = read_inventory(session)
    return Outcome(report.done, inventory, resolve(cfg, name, inventory))


def assert_config(
    session: NvmlSession, cfg: MigConfigFile, name: str
) -> tuple[list[str], Mapping[int, MigTarget]]:
    """How the node differs from config `name` of `cfg`, as `nodeagent mig assert` says it
    (a GPU the config does not select is a difference), and what the config wants."""
    settings = Settings()
    settings = dataclasses.replace(
        settings, mig=dataclasses.replace(settings.mig, config_file="-", config=name)
    )
    configs = ConfigCache(lambda _path: cfg, "MIG config file")
    report = command_pipeline(session, settings, lambda _i: None, None, configs=configs).run_once(
        compare=True
    )
    if report.error is not None:
        raise report.error
    return list(report.differences), resolve(cfg, name, read_inventory(session))
