"""The one way a pipeline is built, for the agent and for the commands that change the node
(`mig apply|assert`, `sharing apply|assert`): the same steps, hooks, lock and checks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nodeagent.base.configfile import ConfigCache
from nodeagent.base.lock import mig_writer_lock
from nodeagent.dra.node import NodeConfig, NodeDriver, Stats
from nodeagent.dra.traces import owner_store
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.apply import Done, Reset
from nodeagent.mig.config import MigConfigFile
from nodeagent.mps.manager import MpsManager
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.reconcile.pipeline import Pipeline, mig_config_cache
from nodeagent.reconcile.ports import Clients, DesireSource, LabelSink, Reporter, SettingsDesire
from nodeagent.settings import Settings
from nodeagent.sharing.offers import Offers
from nodeagent.sharing.plugin import PluginConfigSink
from nodeagent.state.owners import OwnerStore, inventory_reader, with_owners
from nodeagent.state.snapshot import Allocations, Store


def agent_pipeline(
    store: Store,
    settings: Callable[[], Settings],
    reset: Callable[[Settings], Reset],
    lock_path: Path | None,
    mps: MpsManager,
    stats: AgentStats,
    sinks: Sequence[LabelSink] = (),
    desire: DesireSource | None = None,
    allocations: Allocations | None = None,
    clients: Callable[[Settings], Clients | None] | None = None,
    reporter: Reporter | None = None,
    on_published: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    owners: OwnerStore | None = None,
) -> Pipeline:
    """The agent's pipeline: its sinks, then the device plugin's config (when
    sharing.plugin-config-out is set), under the MIG writer lock at `lock_path`; step
    durations measured with `clock` (the agent's one monotonic clock)."""
    offers = Offers()
    plugin = PluginConfigSink(
        lambda: settings().sharing.plugin_config_out,
        lambda: offers.per_gpu,
        lambda: settings().labels.mig_strategy,
    )
    return Pipeline(
        store=store,
        settings=settings,
        desire=desire or SettingsDesire(),
        reset=reset,
        mps=mps,
        stats=stats,
        writer_lock=lambda s: mig_writer_lock(lock_path, s.mig.lock_timeout_seconds),
        sinks=(*sinks, plugin),
        allocations=allocations,
        clients=clients or (lambda _s: None),
        reporter=reporter,
        on_published=on_published,
        offers=offers,
        clock=clock,
        owners=owners,
    )


def command_pipeline(
    session: NvmlSession,
    settings: Settings,
    reset: Reset,
    lock_path: Path | None,
    on_operation: Callable[[Done], None] | None = None,
    configs: ConfigCache[MigConfigFile] | None = None,
    allocations: Allocations | None = None,
    owners: OwnerStore | None = None,
) -> Pipeline:
    """One command's run: no sinks (a command publishes nothing), failures said once by the
    command, hooks around every run as mig-parted's apply, each NVML operation reported to
    `on_operation` as it completes. `configs`: the MIG config file as the command read it;
    `allocations`: which devices pods hold; the claims of the node's ownership record
    (nodeagent.state.owners, beside the MIG writer lock) count as held too."""
    owners = owners or owner_store(session, settings.dra, lock_path)
    return Pipeline(
        store=Store(session, time.time),
        settings=lambda: settings,
        desire=SettingsDesire(),
        reset=lambda _s: reset,
        mps=MpsManager(ComputeModeWriter(session)),
        stats=AgentStats(),
        writer_lock=lambda s: mig_writer_lock(lock_path, s.mig.lock_timeout_seconds),
        log_failures=False,
        one_shot=True,
        on_operation=on_operation,
        configs=configs or mig_config_cache(),
        allocations=with_owners(allocations, owners, inventory_reader(session)),
        owners=owners,
    )


def dra_driver(
    session: NvmlSession,
    settings: Settings,
    config: NodeConfig,
    reset: Reset,
    lock_path: Path | None,
    pods: Allocations | None = None,
    owners: OwnerStore | None = None,
    stats: Stats | None = None,
) -> NodeDriver:
    """The DRA driver's node side on a pipeline of its own (a test, a benchmark; the agent
    gives it the agent's pipeline): its MIG changes go through the pipeline's steps, under
    the MIG writer lock at `lock_path`, around the pods' devices and the claims of the
    ownership record (`owners`; default: the one beside the lock)."""
    dra = dataclasses.replace(settings.dra, plugin_dir=config.plugin_dir, cdi_dir=config.cdi_dir)
    settings = dataclasses.replace(settings, dra=dra)
    owners = owners or owner_store(session, dra, lock_path)
    pipeline = command_pipeline(
        session, settings, reset, lock_path, allocations=pods, owners=owners
    )
    node = NodeDriver(session, config, pipeline, owners, stats)
    node.start()
    return node
