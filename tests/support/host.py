"""Fake host commands for the host duties' tests (nodeagent.host.duties): a script that records
the argv it was run with, one line per run, and exits as told."""

from __future__ import annotations

import stat
from pathlib import Path


def fake_command(folder: Path, name: str, exit_code: int = 0, says: str = "") -> Path:
    """Write `folder/name`: it appends "<name> <args>" to `folder/name.argv`, prints `says`
    and exits `exit_code`. Returns the script; recorded() reads what it recorded."""
    log = folder / f"{name}.argv"
    script = folder / name
    script.write_text(
        f'#!/bin/sh\necho "$(basename "$0")${{*:+ $*}}" >> "{log}"\n'
        + (f"echo '{says}'\n" if says else "")
        + f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def recorded(script: Path) -> list[str]:
    """The command lines `script` (made by fake_command) was run with, in order."""
    log = script.with_name(script.name + ".argv")
    return log.read_text().splitlines() if log.exists() else []
