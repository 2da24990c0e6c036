"""The commands' pipeline: `mig apply|assert` and `sharing apply|assert` (and `run`'s preview of
a sharing config) build the one reconcile pipeline from their flags (nodeagent.agent.factory),
run it once, and say its failure in one sentence. mig-parted's --mode-only and --skip-reset
shape the pipeline here too."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from nodeagent.base.errors import AgentError, ConfigError, ResetLeftToUser
from nodeagent.cli.common import Context, reset_for

if TYPE_CHECKING:
    from nodeagent.mig.apply import Done
    from nodeagent.mig.config import MigConfigFile
    from nodeagent.nvml.inventory import Inventory
    from nodeagent.reconcile import Pipeline, Report


def config_name(ctx: Context, cfg: MigConfigFile) -> str:
    """-c NAME; a file holding one config needs none (as mig-parted)."""
    name: str | None = ctx.settings.mig.config
    if not name and len(cfg.configs) == 1:
        return next(iter(cfg.configs))
    if not name:
        raise ConfigError(
            f"no config name: {cfg.source} defines {len(cfg.configs)} configs"
            f" ({', '.join(sorted(cfg.configs))}); pass -c NAME"
            " or set NODEAGENT_MIG_CONFIG (or MIG_PARTED_SELECTED_CONFIG)"
        )
    return name


def describe_op(done: Done) -> str:
    """One operation as the text output says it ("GPU 0: create-gi 1g.18gb at 6:1 (GI 9)")."""
    from nodeagent.mig.plan import Op
    from nodeagent.mig.profile import profile_or_none

    op = done.op
    text = f"GPU {op.gpu}: {op.op.value}"
    if op.enabled is not None:
        text += " enabled" if op.enabled else " disabled"
    if op.profile is not None:
        slices = op.slice_count if op.op is Op.CREATE_CI else None
        gi = profile_or_none(op.profile)
        full = gi is None or slices == gi.g
        text += f" {op.profile}" if slices is None or full else f" {slices}c.{op.profile}"
        if slices is not None and not full:
            text += f" (compute slice {op.ci_start or 0})"
    if op.placement is not None:
        text += f" at {op.placement.start}:{op.placement.size}"
    ids = [
        f"GI {done.gi_id}" if done.gi_id is not None else "",
        f"CI {done.ci_id}" if done.ci_id is not None else "",
    ]
    ids = [i for i in ids if i]
    return text + (f" ({', '.join(ids)})" if ids else "")


def _print_progress(done: Done) -> None:
    print(describe_op(done), flush=True)


def mig_pipeline(ctx: Context, progress: bool = False) -> tuple[Pipeline, str]:
    """The command's pipeline for the MIG config of -f/-c, and that config's name (-c, or
    the one config of a file that holds one, as mig-parted). With --mode-only the config is
    read as mig-parted's --mode-only reads it; with --skip-reset no GPU is reset."""
    from nodeagent.agent.factory import command_pipeline
    from nodeagent.base.configfile import ConfigCache
    from nodeagent.base.lock import lock_path
    from nodeagent.nvml import read_inventory
    from nodeagent.reconcile import mig_config_cache

    settings = ctx.settings
    node = settings.node
    # Text output shows each operation as it completes: a slow mode change or reset shows
    # where it is, and a killed apply shows how far it got.
    text = progress and dialect(ctx) == "nodeagent" and ctx.args.output != "json"
    show = _print_progress if text else None
    path = lock_path(node.run_dir, node.sim_state, bool(node.simulate))
    configs: ConfigCache[MigConfigFile] = mig_config_cache()  # one read of the file (stdin too)
    if not settings.mig.config_file and dialect(ctx) == "mig-parted":
        raise ConfigError("missing required flags 'config-file'")  # mig-parted's CheckFlags
    if not (settings.mig.config_file or settings.mig.config):  # no file: the generated configs
        raise ConfigError(
            "no MIG config: pass -c NAME (of the configs generated from the GPUs, see"
            " 'nodeagent mig generate-config', or of -f FILE)"
        )
    cfg = configs.load(settings.mig.config_file) if settings.mig.config_file else None
    name = settings.mig.config or (config_name(ctx, cfg) if cfg else "")
    if ctx.args.mode_only:
        from nodeagent.mig.generate import GeneratedConfigs

        inventory = read_inventory(ctx.session)
        modes = mode_only(cfg or GeneratedConfigs().load(inventory), name, inventory)
        configs = ConfigCache(lambda _path: modes, "MIG config file")
    named = dataclasses.replace(settings, mig=dataclasses.replace(settings.mig, config=name))
    reset = reset_for(settings, ctx.lib)
    if ctx.args.skip_reset:
        reset = no_reset
    pipeline = command_pipeline(ctx.session, named, reset, path, show, configs, stops=ctx.stops)
    return pipeline, name


def dialect(ctx: Context) -> str:
    """ "mig-parted" under `nvidia-mig-parted` (its messages), else "nodeagent"."""
    dialect: str = ctx.args.dialect
    return dialect


def failed(report: Report) -> None:
    """Raise the error a failed run ended with (the CLI says it in one sentence)."""
    if report.error is not None:
        raise report.error
    if report.result != "success":
        raise AgentError(report.reason or "the config could not be applied")


def sharing_pipeline(ctx: Context) -> Pipeline:
    from nodeagent.agent.factory import command_pipeline
    from nodeagent.base.lock import lock_path

    settings = ctx.settings
    if not settings.sharing.config:
        raise ConfigError("no sharing config name: pass -c NAME or set NODEAGENT_SHARING_CONFIG")
    if not settings.sharing.config_file:
        raise ConfigError(
            "no sharing config file: pass -f FILE or set NODEAGENT_SHARING_CONFIG_FILE"
        )
    node = settings.node
    path = lock_path(node.run_dir, node.sim_state, bool(node.simulate))
    reset = reset_for(settings, ctx.lib)
    return command_pipeline(ctx.session, settings, reset, path, stops=ctx.stops)


def sharing_preview(ctx: Context) -> dict[int, tuple[str, int]]:
    """What each GPU the sharing config (-f FILE -c NAME) covers would offer (strategy,
    replicas), checked exactly as `sharing apply` checks it: the same pipeline run dry
    (observe, desire, resolve, plan), changing nothing. Raises what apply would raise."""
    report = sharing_pipeline(ctx).run_once(dry_run=True)
    failed(report)
    return dict(report.sharing)


def mode_only(cfg: MigConfigFile, name: str, inventory: Inventory) -> MigConfigFile:
    """Config `name` as --mode-only reads it: each GPU it selects gets the MIG mode it asks
    for and keeps the MIG devices it has (none where MIG is being enabled). mig-parted clears
    the devices of every MIG GPU once one mode differs; nodeagent touches only GPUs whose mode
    changes."""
    from nodeagent.mig.config import Entry, ProfileCount
    from nodeagent.mig.plan import device_counts
    from nodeagent.mig.profile import profile_or_none
    from nodeagent.mig.select import resolve

    entries = {str(e.mark): e for e in cfg.configs.get(name, ())}
    gpus = {gpu.index: gpu for gpu in inventory.gpus}
    derived = []
    for index, want in sorted(resolve(cfg, name, inventory).items()):
        gpu, mark = gpus[index], entries[want.source].mark
        kept = device_counts(gpu) if want.mig_enabled and gpu.mig_current else {}
        devices = tuple(
            ProfileCount(profile, count, mark, parsed)
            for profile, count in kept.items()
            if (parsed := profile_or_none(profile)) is not None
        )
        derived.append(Entry((index,), None, want.mig_enabled, devices, mark, mark))
    return dataclasses.replace(cfg, configs={**cfg.configs, name: tuple(derived)})


def no_reset(index: int) -> None:
    raise ResetLeftToUser(
        f"GPU {index}: the MIG mode change is pending and --skip-reset leaves the GPU reset to"
        f" you (nvidia-smi -r -i {index}); apply again after it"
    )
