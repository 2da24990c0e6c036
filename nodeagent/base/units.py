"""Sizes as people and the MPS daemon write them, and whole numbers as programs write them.
Pure; bottom layer."""

from __future__ import annotations

import re

from nodeagent.base.errors import ConfigError

# At most this many digits in any number nodeagent reads: every count, index, percentage, pid
# and byte size it meets is below 10**18, and int() of a few thousand digits fails (Python's
# limit on converting long digit strings) or costs time.
MAX_DIGITS = 18
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
SIZE_RE = re.compile(rf"^([0-9]{{1,{MAX_DIGITS}}})\s*([KMGT]?)(?:I?B)?$", re.IGNORECASE)
_DECIMAL = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}(?:\.[0-9]{{1,{MAX_DIGITS}}})?")


def is_digits(text: str, max_digits: int = MAX_DIGITS) -> bool:
    """Whether `text` is 1 to `max_digits` ASCII digits and nothing else. str.isdigit() also
    takes '²' (which int() refuses) and Arabic-Indic digits (which int() reads: '٢٠' is 20),
    and a regular expression's \\d and $ take them and a trailing newline."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def whole_number(text: object, max_digits: int = MAX_DIGITS) -> int | None:
    """`text` read as a whole number written in ASCII digits only (is_digits); None for
    anything else: a sign, a space, a newline, other digits, more than `max_digits`, a
    value that is not a string."""
    return int(text) if isinstance(text, str) and is_digits(text, max_digits) else None


def decimal(text: str) -> float | None:
    """'25.0' or '25' (ASCII digits, an optional fraction) -> 25.0; None for anything else
    (float() takes '٢٥', 'nan', '1e400' and spaces around)."""
    return float(text) if _DECIMAL.fullmatch(text) else None


def parse_size(text: str, what: str = "size") -> int:
    """'2G', '2048M', '512MiB', '4GB' -> bytes (binary units, as the MPS daemon reads them).
    Raises ConfigError naming `what`."""
    match = SIZE_RE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"{what} {text!r} is not a size like 2G, 2048M or 512MiB")
    return int(match.group(1)) * UNITS[match.group(2).upper()]
