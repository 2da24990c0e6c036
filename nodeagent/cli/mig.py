"""`nodeagent mig apply|assert|export|generate-config`, with mig-parted's flags and
MIG_PARTED_* variables (nodeagent.cli.migparted); also the commands of `nvidia-mig-parted`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeagent.base.errors import ConfigError
from nodeagent.cli.common import (
    Context,
    add_setting_flags,
    output_flag,
    print_json,
)

if TYPE_CHECKING:
    pass

# mig-parted's own flag names work too: -f/--config-file, -c/--selected-config, -k/--hooks-file.
MIG_FLAG_NAMES = {
    "mig.config-file": ("-f", "--file", "--config-file"),
    "mig.config": ("-c", "--config", "--selected-config"),
    "mig.hooks-file": ("-k", "--hooks-file"),
}
NO_FILE = (
    "no MIG config file: pass -f FILE or set NODEAGENT_MIG_CONFIG_FILE (or MIG_PARTED_CONFIG_FILE)"
)
ASSERTION_FAILURE = "Assertion failure: selected configuration not currently applied"


def cmd_mig_apply(ctx: Context) -> int:
    from nodeagent.cli.pipelines import describe_op, dialect, failed, mig_pipeline
    from nodeagent.host.hooks import apply_switches

    pipeline, name = mig_pipeline(ctx, progress=True)
    with apply_switches(bool(ctx.args.skip_reset), bool(ctx.args.mode_only)):
        report = pipeline.run_once(dry_run=ctx.args.dry_run)
    failed(report)
    ops = list(report.done)
    if dialect(ctx) == "mig-parted":
        print("MIG configuration applied successfully")
        return 0
    if ctx.args.output == "json":
        operations = [op.to_dict() for op in ops]
        print_json({"config": name, "dry_run": ctx.args.dry_run, "operations": operations})
        return 0
    verb = "would run" if ctx.args.dry_run else "ran"
    if not ops:
        print(f"config {name!r}: the GPUs already match; nothing to change")
        return 0
    if ctx.args.dry_run:
        for op in ops:
            print(describe_op(op))
    print(f"config {name!r}: {verb} {len(ops)} NVML operation{'s' if len(ops) != 1 else ''}")
    return 0


def cmd_mig_assert(ctx: Context) -> int:
    """As mig-parted's assert: a GPU the config does not select is a difference too."""
    from nodeagent.cli.pipelines import config_name, dialect, failed, mig_pipeline

    upstream = dialect(ctx) == "mig-parted"
    if ctx.args.valid_config:  # the file and the name only, as mig-parted: no GPU is read
        from nodeagent.reconcile import mig_config_cache

        if not ctx.settings.mig.config_file:
            raise ConfigError(NO_FILE)

        cfg = mig_config_cache().load(ctx.settings.mig.config_file)
        name = ctx.settings.mig.config or config_name(ctx, cfg)
        if name not in cfg.configs:
            raise ConfigError(f"{cfg.source}: no config named {name!r}")
        print("Selected MIG configuration is valid" if upstream else f"config {name!r}: valid")
        return 0
    pipeline, name = mig_pipeline(ctx)
    report = pipeline.run_once(compare=True)
    failed(report)
    for problem in report.differences:  # mig-parted says why only with -d, on stderr
        if not upstream or ctx.args.debug:
            print(problem, file=sys.stderr if upstream else sys.stdout)
    if report.differences and upstream:
        print(f"nvidia-mig-parted: {ASSERTION_FAILURE}", file=sys.stderr)
    if report.differences:
        return 1
    what = "MIG mode settings" if ctx.args.mode_only else "MIG configuration"
    if upstream:
        print(f"Selected {what} {'from configuration ' if ctx.args.mode_only else ''}"
              "currently applied")  # fmt: skip
    else:
        print(f"config {name!r}: the GPUs match" + (" (MIG mode)" if ctx.args.mode_only else ""))
    return 0


def _write(ctx: Context, configs: dict[str, list[dict[str, Any]]], target: str | None) -> None:
    """Print (or with -f write) a v1 file of `configs`: -o yaml (default) or json."""
    from nodeagent.mig.config import dump_config

    fmt = ctx.args.output_format or "yaml"
    if fmt not in ("yaml", "json"):
        raise ConfigError(f"unrecognized output format {fmt!r}: yaml or json")
    if fmt == "yaml":
        text = dump_config(configs)
    else:
        import json

        text = json.dumps({"version": "v1", "mig-configs": configs}, indent=2) + "\n"
    if target:
        from nodeagent.base.files import atomic_write_text, os_refusal

        try:
            atomic_write_text(Path(target), text, what="output file")
        except OSError as err:
            raise os_refusal(err, f"cannot write the output file {target}") from err
    else:
        sys.stdout.write(text)


def cmd_mig_export(ctx: Context) -> int:
    from nodeagent.mig.generate import export_current
    from nodeagent.nvml import read_inventory

    label = "current" if ctx.args.config_label is None else ctx.args.config_label
    if not label:
        raise ConfigError("the config label (-l) must not be empty")
    configs = export_current(read_inventory(ctx.session))
    _write(ctx, {label: configs["current"]}, None)
    return 0


def cmd_mig_generate(ctx: Context) -> int:
    from nodeagent.mig.generate import generate_configs
    from nodeagent.nvml import read_inventory

    _write(ctx, generate_configs(read_inventory(ctx.session)), ctx.args.output_file)
    return 0


def add_mig_parser(sub: Any) -> None:
    mig = sub.add_parser("mig", help="MIG geometry: apply, assert, export, generate-config")
    migsub = mig.add_subparsers(dest="mig_command", metavar="MIGCOMMAND")
    migsub.required = True
    add_mig_commands(migsub)


def _debug_flag(p: argparse.ArgumentParser) -> None:
    """-d after the command too (mig-parted's flags are inherited by its commands)."""
    p.add_argument(
        "-d", "--debug", action="store_true", default=argparse.SUPPRESS,
        help="debug logging (MIG_PARTED_DEBUG), and the traceback of an internal error",
    )  # fmt: skip


def _switch(p: argparse.ArgumentParser, short: str, name: str, help_text: str) -> None:
    p.add_argument(short, name, action="store_true", help=help_text)


def _format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o", "--output-format", "--output", metavar="FORMAT", default=None,
        help="yaml (default) or json (MIG_PARTED_OUTPUT_FORMAT)",
    )  # fmt: skip


def add_mig_commands(migsub: Any) -> None:
    """apply, assert, export, generate-config: under `nodeagent mig` and `nvidia-mig-parted`.
    Each declares the MIG_PARTED_* variables it reads, as mig-parted's command does."""
    p = migsub.add_parser("apply", help="bring the GPUs to a config, changing only what must")
    add_setting_flags(p, ["mig"], MIG_FLAG_NAMES)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    _switch(p, "-m", "--mode-only", "only the MIG mode of the config, not its MIG devices"
            " (MIG_PARTED_MODE_CHANGE_ONLY)")  # fmt: skip
    _switch(p, "-s", "--skip-reset", "never reset a GPU: a mode change left pending is an"
            " error (MIG_PARTED_SKIP_RESET)")  # fmt: skip
    output_flag(p)
    _debug_flag(p)
    # dra: the DRA checkpoint's claims are held slices (read from dra.plugin-dir; no flags)
    p.set_defaults(func=cmd_mig_apply, groups=("node", "mig", "dra"), mig_parted_env=(
        "MIG_PARTED_CONFIG_FILE", "MIG_PARTED_SELECTED_CONFIG", "MIG_PARTED_HOOKS_FILE",
        "MIG_PARTED_SKIP_RESET", "MIG_PARTED_MODE_CHANGE_ONLY", "MIG_PARTED_DEBUG",
    ))  # fmt: skip
    p = migsub.add_parser("assert", help="exit 0 when the GPUs match a config, 1 when not")
    add_setting_flags(p, ["mig"], MIG_FLAG_NAMES, skip=["mig.reset-command", "mig.lock-timeout"])
    _switch(p, "-m", "--mode-only", "only the MIG mode of the config, not its MIG devices"
            " (MIG_PARTED_MODE_CHANGE_ONLY)")  # fmt: skip
    _switch(p, "-a", "--valid-config", "only that the file is valid and holds the config;"
            " no GPU is read (MIG_PARTED_VALID_CONFIG)")  # fmt: skip
    _debug_flag(p)
    p.set_defaults(func=cmd_mig_assert, groups=("node", "mig"), skip_reset=False, mig_parted_env=(
        "MIG_PARTED_CONFIG_FILE", "MIG_PARTED_SELECTED_CONFIG", "MIG_PARTED_MODE_CHANGE_ONLY",
        "MIG_PARTED_VALID_CONFIG", "MIG_PARTED_DEBUG",
    ))  # fmt: skip
    # export and generate-config print a v1 file: -o yaml|json and one flag of their own
    for name, help_text, func, own, own_help in (
        ("export", "the current geometry as a v1 config named 'current'", cmd_mig_export,
         ("-l", "--config-label", "MIG_PARTED_CONFIG_LABEL"), "the config name (default current)"),
        ("generate-config", "default configs for the GPUs present", cmd_mig_generate,
         ("-f", "--output-file", "MIG_PARTED_OUTPUT_FILE"), "write here instead of stdout"),
    ):  # fmt: skip
        p = migsub.add_parser(name, help=help_text)
        _format_flag(p)
        p.add_argument(own[0], own[1], default=None, help=f"{own_help} ({own[2]})")
        _debug_flag(p)
        p.set_defaults(func=func, groups=("node",), mig_parted_env=(
            "MIG_PARTED_OUTPUT_FORMAT", own[2], "MIG_PARTED_DEBUG",
        ))  # fmt: skip
