"""`nodeagent mig apply|assert|export|generate-config`."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from nodeagent.cli.common import (
    Context,
    add_setting_flags,
    output_flag,
    print_json,
    reset_for,
)
from nodeagent.errors import AgentError, ConfigError
from nodeagent.lock import lock_path
from nodeagent.mig.profile import profile_or_none
from nodeagent.nvml import read_inventory

if TYPE_CHECKING:
    from nodeagent.mig.config import MigConfigFile
    from nodeagent.reconcile import Pipeline, Report

# mig-parted's own flag names work too: -f/--config-file and -c/--selected-config.
MIG_FLAG_NAMES = {
    "mig.config-file": ("-f", "--file", "--config-file"),
    "mig.config": ("-c", "--config", "--selected-config"),
}


def _config_name(ctx: Context, cfg: MigConfigFile) -> str:
    """-c NAME; a file holding one config needs none (as mig-parted)."""
    name: str | None = ctx.settings.mig.config
    if not name and len(cfg.configs) == 1:
        return next(iter(cfg.configs))
    if not name:
        raise ConfigError(
            f"no config name: {cfg.source} defines {len(cfg.configs)} configs"
            f" ({', '.join(sorted(cfg.configs))}); pass -c NAME or set NODEAGENT_MIG_CONFIG"
        )
    return name


def _describe_op(op: dict[str, Any]) -> str:
    text = f"GPU {op['gpu']}: {op['op']}"
    if "enabled" in op:
        text += " enabled" if op["enabled"] else " disabled"
    if "profile" in op:
        slices = op.get("compute_slices")
        gi = profile_or_none(str(op["profile"]))
        full = gi is None or slices == gi.g
        text += f" {op['profile']}" if slices is None or full else f" {slices}c.{op['profile']}"
        if slices is not None and not full:
            text += f" (compute slice {op.get('ci_start', 0)})"
    if "placement" in op:
        text += f" at {op['placement']['start']}:{op['placement']['size']}"
    ids = [
        f"GI {op['gi_id']}" if "gi_id" in op else "",
        f"CI {op['ci_id']}" if "ci_id" in op else "",
    ]
    ids = [i for i in ids if i]
    return text + (f" ({', '.join(ids)})" if ids else "")


def _print_progress(op: dict[str, Any]) -> None:
    print(_describe_op(op), flush=True)


def _pipeline(ctx: Context, progress: bool = False) -> tuple[Pipeline, str]:
    """The command's pipeline for the MIG config of -f/-c, and that config's name (-c, or
    the one config of a file that holds one, as mig-parted)."""
    from nodeagent.reconcile import command_pipeline, mig_config_cache

    settings = ctx.settings
    node = settings.node
    # Text output shows each operation as it completes: a slow mode change or reset shows
    # where it is, and a killed apply shows how far it got.
    show = _print_progress if progress and ctx.args.output != "json" else None
    path = lock_path(node.run_dir, node.sim_state, bool(node.simulate))
    configs = mig_config_cache()  # the one read of the file, kept for the run (stdin too)
    if not (settings.mig.config_file or settings.mig.config):  # no file: the generated configs
        raise ConfigError(
            "no MIG config: pass -c NAME (of the configs generated from the GPUs, see"
            " 'nodeagent mig generate-config', or of -f FILE)"
        )
    name = settings.mig.config or _config_name(ctx, configs.load(settings.mig.config_file))
    named = dataclasses.replace(settings, mig=dataclasses.replace(settings.mig, config=name))
    reset = reset_for(settings, ctx.lib)
    return command_pipeline(ctx.session, named, reset, path, show, configs), name


def failed(report: Report) -> None:
    """Raise the error a failed run ended with (the CLI says it in one sentence)."""
    if report.error is not None:
        raise report.error
    if report.result != "success":
        raise AgentError(report.reason or "the config could not be applied")


def cmd_mig_apply(ctx: Context) -> int:
    pipeline, name = _pipeline(ctx, progress=True)
    report = pipeline.run_once(dry_run=ctx.args.dry_run)
    failed(report)
    ops = list(report.done)
    if ctx.args.output == "json":
        print_json({"config": name, "dry_run": ctx.args.dry_run, "operations": ops})
        return 0
    verb = "would run" if ctx.args.dry_run else "ran"
    if not ops:
        print(f"config {name!r}: the GPUs already match; nothing to change")
        return 0
    if ctx.args.dry_run:
        for op in ops:
            print(_describe_op(op))
    print(f"config {name!r}: {verb} {len(ops)} NVML operation{'s' if len(ops) != 1 else ''}")
    return 0


def cmd_mig_assert(ctx: Context) -> int:
    """As mig-parted's assert: a GPU the config does not select is a difference too."""
    pipeline, name = _pipeline(ctx)
    report = pipeline.run_once(compare=True)
    failed(report)
    for problem in report.differences:
        print(problem)
    if report.differences:
        return 1
    print(f"config {name!r}: the GPUs match")
    return 0


def cmd_mig_export(ctx: Context) -> int:
    from nodeagent.mig.config import dump_config
    from nodeagent.mig.generate import export_current

    sys.stdout.write(dump_config(export_current(read_inventory(ctx.session))))
    return 0


def cmd_mig_generate(ctx: Context) -> int:
    from nodeagent.mig.config import dump_config
    from nodeagent.mig.generate import generate_configs

    sys.stdout.write(dump_config(generate_configs(read_inventory(ctx.session))))
    return 0


def add_mig_parser(sub: Any) -> None:
    mig = sub.add_parser("mig", help="MIG geometry: apply, assert, export, generate-config")
    migsub = mig.add_subparsers(dest="mig_command", metavar="MIGCOMMAND")
    migsub.required = True

    p = migsub.add_parser("apply", help="bring the GPUs to a config, changing only what must")
    add_setting_flags(p, ["mig"], MIG_FLAG_NAMES)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    output_flag(p)
    # dra: the DRA checkpoint's claims are held slices (read from dra.plugin-dir; no flags)
    p.set_defaults(func=cmd_mig_apply, groups=("node", "mig", "dra"))
    p = migsub.add_parser("assert", help="exit 0 when the GPUs match a config, 1 when not")
    add_setting_flags(p, ["mig"], MIG_FLAG_NAMES, skip=["mig.reset-command", "mig.lock-timeout"])
    p.set_defaults(func=cmd_mig_assert, groups=("node", "mig"))
    p = migsub.add_parser("export", help="the current geometry as a v1 config named 'current'")
    p.set_defaults(func=cmd_mig_export, groups=("node",))
    p = migsub.add_parser("generate-config", help="default configs for the GPUs present")
    p.set_defaults(func=cmd_mig_generate, groups=("node",))
