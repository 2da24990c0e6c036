"""Sizes as people and the MPS daemon write them. Pure; bottom layer."""

from __future__ import annotations

import re

from nodeagent.base.errors import ConfigError

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SIZE_RE = re.compile(r"^(\d+)\s*([KMGT]?)(?:I?B)?$", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """'2G', '2048M', '512MiB', '4GB' -> bytes (binary units, as the MPS daemon reads them).
    Raises ConfigError naming `what`."""
    match = SIZE_RE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"{what} {text!r} is not a size like 2G, 2048M or 512MiB")
    return int(match.group(1)) * UNITS[match.group(2).upper()]
