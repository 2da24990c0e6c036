"""MkDocs hook: the CLI and settings reference pages, generated from the code at every build
(nothing is written to disk, so they cannot drift from the code)."""

from __future__ import annotations

import argparse
from typing import Any

from mkdocs.structure.files import File, Files

EXIT_CODES = """\
| code | meaning |
|------|---------|
| 0 | done; for `run`, also stopped by SIGTERM or Ctrl-C at any point |
| 1 | an assertion was false, nothing matched, or (`plan`) demand that does not fit |
| 2 | bad input: config, flags, simulate spec, emulator state file, unknown device |
| 3 | the GPU or the system refused: an NVML error, a slice in use, a lock held |
| 4 | an internal error (a bug): one line; `-d`/`--debug` shows the traceback |
| 5 | a MIG mode change waits for the node to reboot |
| 130, 143 | any other command stopped by Ctrl-C or SIGTERM (128 + the signal's number) |
"""


def _commands(parser: argparse.ArgumentParser, prefix: str = "nodeagent") -> list[tuple[str, str]]:
    """(command line, its --help) for the parser and every subcommand, depth first."""
    out = [(prefix, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{prefix} {name}")
    return out


def _reasons() -> list[str]:
    """The error classes of nodeagent.base.errors as a table: reason, consequence, exit code."""
    from nodeagent.base import errors

    rows = ["| reason | consequence | exit code | what failed (error class) |", "|---|---|---|---|"]
    classes = [c for c in vars(errors).values() if isinstance(c, type)]
    for cls in sorted(
        (c for c in classes if issubclass(c, errors.AgentError)), key=lambda c: c.reason
    ):
        doc = " ".join((cls.__doc__ or "").split()).split(". ")[0].rstrip(".")
        then = "retry" if cls.retry else "refused"
        rows.append(f"| `{cls.reason}` | {then} | {cls.exit_code} | {doc} (`{cls.__name__}`) |")
    return rows


def cli_page() -> str:
    from nodeagent.cli.commands import build_parser

    parser = build_parser()
    parser.prog = "nodeagent"
    lines = [
        "# CLI reference",
        "",
        "Generated from the command's own parser at every build of this site.",
        "",
        "## Exit codes",
        "",
        EXIT_CODES,
        "Errors go to stderr as one sentence naming what is wrong, never a traceback"
        " ([Troubleshooting](../troubleshooting.md)).",
        "",
        "## Failure reasons",
        "",
        "Each failure has a reason and a consequence: *retry* (the same command may succeed"
        " later, unchanged) or *refused* (only a change of the input helps). With"
        ' `--output json` a failed command also prints `{"error": <the sentence>,'
        ' "reason": ..., "retry": true|false}` to stdout; the DRA driver\'s'
        " `nodeagent_dra_refusals_total{reason}` counts by the same reasons.",
        "",
        *_reasons(),
        "",
    ]
    for command, text in _commands(parser):
        lines += [f"## `{command}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _default(group: str, field: str) -> str:
    from nodeagent.settings import Settings

    value = getattr(getattr(Settings(), group), field, None)
    if value is None or value == () or value == {}:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`"


def settings_page() -> str:
    from nodeagent.settings.specs import SPECS

    lines = [
        "# Settings reference",
        "",
        "Every setting: its key in the settings file (`--config FILE`, `version: nodeagent/v1`,"
        " `group:` then `key:`), its flag, its environment variable(s), its default, whether a"
        " reload (SIGHUP) may change it, and what it means. A variable wins over the file, a"
        " flag over both. Generated from `nodeagent/settings/specs.py` at every build.",
        "",
        "| key | flag | variable | default | reload | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for s in SPECS:
        flag = f"`{s.flag}`" if s.flag else "—"
        env = ", ".join(f"`{e}`" for e in s.env) or "—"
        meaning = s.help.replace("|", "\\|").replace("\n", " ")
        hot = "yes" if s.hot else "restart"
        lines.append(
            f"| `{s.dotted}` | {flag} | {env} | {_default(s.group, s.field)} | {hot} | {meaning} |"
        )
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    for uri, content in (
        ("reference/cli.md", cli_page()),
        ("reference/settings.md", settings_page()),
    ):
        files.append(File.generated(config, uri, content=content))
    return files
