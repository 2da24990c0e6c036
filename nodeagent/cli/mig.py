"""`nodeagent mig apply|assert|export|generate-config`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nodeagent.cli.common import (
    Context,
    add_setting_flags,
    output_flag,
    print_json,
    reset_for,
)
from nodeagent.errors import AgentError, ConfigError
from nodeagent.lock import lock_path, mig_writer_lock
from nodeagent.mig.profile import profile_or_none
from nodeagent.nvml import read_inventory

if TYPE_CHECKING:
    from nodeagent.mig.config import MigConfigFile

# mig-parted's own flag names work too: -f/--config-file and -c/--selected-config.
MIG_FLAG_NAMES = {
    "mig.config-file": ("-f", "--file", "--config-file"),
    "mig.config": ("-c", "--config", "--selected-config"),
}


def _read_config(ctx: Context) -> MigConfigFile:
    from nodeagent.mig.config import load_config

    return load_config(ctx.settings.mig.config_file)


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


@contextlib.contextmanager
def _hooks_around(ctx: Context, cfg: MigConfigFile, name: str) -> Iterator[None]:
    """mig-parted's `apply --hooks-file`: apply-start and apply-exit always, pre-apply-mode
    and pre-apply-config when the plan changes the mode or the instances. A failing hook before
    the change stops it (nothing changed); apply-exit runs once apply-start did."""
    mig = ctx.settings.mig
    if not mig.hooks_file:
        yield
        return
    from nodeagent.hooks import load_hooks, run_hook
    from nodeagent.mig.apply import reconfigure

    hooks = load_hooks(mig.hooks_file)
    env = {
        "MIG_PARTED_CONFIG_FILE": mig.config_file or "",
        "MIG_PARTED_SELECTED_CONFIG": name,
        "MIG_PARTED_HOOKS_FILE": mig.hooks_file,
    }

    def hook(which: str, **extra: str) -> None:
        run_hook(hooks, which, {**env, "NODEAGENT_HOOK": which, **extra}, mig.hook_timeout_seconds)

    hook("apply-start")
    result = "failure"
    try:
        planned = reconfigure(
            ctx.session, cfg, name, reset_for(ctx.settings, ctx.lib), dry_run=True
        )
        kinds = {op.op for op in planned.plan.operations}
        if "set-mig-mode" in kinds:
            hook("pre-apply-mode")
        if kinds - {"set-mig-mode"}:
            hook("pre-apply-config")
        yield
        result = "success"
    finally:
        if result == "success":
            hook("apply-exit", NODEAGENT_RESULT=result)
        else:  # the change's own error is the one to report
            try:
                hook("apply-exit", NODEAGENT_RESULT=result)
            except AgentError as err:
                print(f"nodeagent: {err}", file=sys.stderr)


def cmd_mig_apply(ctx: Context) -> int:
    cfg = _read_config(ctx)
    name = _config_name(ctx, cfg)
    from nodeagent.mig.apply import reconfigure

    settings = ctx.settings
    node = settings.node
    reset = reset_for(settings, ctx.lib)
    if ctx.args.dry_run:
        outcome = reconfigure(ctx.session, cfg, name, reset, dry_run=True)
    else:
        # One MIG writer per node: this waits for (or fails naming) an agent or another apply.
        path = lock_path(node.run_dir, node.sim_state, bool(node.simulate))
        with mig_writer_lock(path, settings.mig.lock_timeout_seconds):
            # Text output shows each operation as it completes: a slow mode change or reset
            # shows where it is, and a killed apply shows how far it got.
            progress = None if ctx.args.output == "json" else _print_progress
            with _hooks_around(ctx, cfg, name):
                outcome = reconfigure(ctx.session, cfg, name, reset, on_done=progress)
    ops = (
        [op.to_dict() for op in outcome.plan.operations] if ctx.args.dry_run else list(outcome.done)
    )
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
    cfg = _read_config(ctx)
    name = _config_name(ctx, cfg)
    from nodeagent.mig.apply import assert_config

    problems, _ = assert_config(ctx.session, cfg, name)
    for problem in problems:
        print(problem)
    if problems:
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
    p.set_defaults(func=cmd_mig_apply, groups=("node", "mig"))
    p = migsub.add_parser("assert", help="exit 0 when the GPUs match a config, 1 when not")
    add_setting_flags(p, ["mig"], MIG_FLAG_NAMES, skip=["mig.reset-command", "mig.lock-timeout"])
    p.set_defaults(func=cmd_mig_assert, groups=("node", "mig"))
    p = migsub.add_parser("export", help="the current geometry as a v1 config named 'current'")
    p.set_defaults(func=cmd_mig_export, groups=("node",))
    p = migsub.add_parser("generate-config", help="default configs for the GPUs present")
    p.set_defaults(func=cmd_mig_generate, groups=("node",))
