"""MIG profile names as NVIDIA's tools parse them (go-nvlib's MIG profile grammar). Pure.

    <g>g.<gb>gb[+attr,...|-attr,...]          a GPU instance with one compute instance over it
    <c>c.<g>g.<gb>gb[+attr,...|-attr,...]     a compute instance of c slices inside such a GI

Attributes: `+me` (media extensions), `+me.all`, `+gfx`, `-me` (without media extensions);
a name carries `+` attributes or `-` attributes, never both. `1c.1g.5gb` is `1g.5gb`. The
format is checked on its own (the whole file); whether a GPU offers the profile is checked
against that GPU only (a config naming a profile one model lacks fails on that model alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER = re.compile(r"[0-9]+")
_ATTRIBUTE_CHARS = re.compile(r"[A-Za-z0-9.]+")


class ProfileFormatError(ValueError):
    """The reason a profile name does not follow the grammar (one short clause)."""


@dataclass(frozen=True, order=True)
class ProfileName:
    """A parsed profile name. `c == g` for a GPU instance with one full compute instance."""

    g: int
    gb: int
    c: int
    attributes: tuple[str, ...] = ()  # sorted: '+me,gfx' equals '+gfx,me'
    negative: bool = False  # '-me': the attributes are ones the profile lacks

    @property
    def suffix(self) -> str:
        if not self.attributes:
            return ""
        return ("-" if self.negative else "+") + ",".join(self.attributes)

    @property
    def gi(self) -> str:
        """The GPU-instance profile's name: '1c.3g.40gb' -> '3g.40gb'."""
        return f"{self.g}g.{self.gb}gb{self.suffix}"

    @property
    def full(self) -> bool:
        return self.c == self.g

    def __str__(self) -> str:
        return self.gi if self.full else f"{self.c}c.{self.gi}"

    def same_gi(self, other: ProfileName) -> bool:
        return (self.g, self.gb, self.attributes, self.negative) == (
            other.g,
            other.gb,
            other.attributes,
            other.negative,
        )


def _field(text: str, unit: str) -> int:
    if not text.endswith(unit):
        raise ProfileFormatError(f"missing {unit!r} in '%d{unit}'")
    digits = text[: -len(unit)]
    if not _NUMBER.fullmatch(digits) or len(digits) > 9:  # Go's Atoi overflows past int
        raise ProfileFormatError(f"malformed number in '%d{unit}'")
    return int(digits)


def _attributes(text: str) -> tuple[str, ...]:
    items = text.split(",")
    seen: set[str] = set()
    for a in items:
        if not a:
            raise ProfileFormatError("empty attribute in list")
        if a in seen:
            raise ProfileFormatError(f"attribute {a!r} is listed twice")
        if not _ATTRIBUTE_CHARS.fullmatch(a):
            raise ProfileFormatError(f"attribute {a!r} has a character other than A-Z a-z 0-9 .")
        if a[0].isdigit():
            raise ProfileFormatError(f"attribute {a!r} begins with a number")
        if a[0] == "." or a[-1] == ".":
            raise ProfileFormatError(f"attribute {a!r} begins or ends with a dot")
        seen.add(a)
    return tuple(sorted(items))


def parse_profile(text: str) -> ProfileName:
    """Parse a profile name; raises ProfileFormatError with the reason."""
    if not text:
        raise ProfileFormatError("the profile is empty")
    if text.strip() != text or any(ch.isspace() for ch in text):
        raise ProfileFormatError("spaces are not allowed")
    plus, minus = "+" in text, "-" in text
    if plus and minus:
        raise ProfileFormatError("it has both '+' and '-' attributes")
    sep = "+" if plus else "-" if minus else None
    base, attrs = text.split(sep, 1) if sep else (text, None)
    parts = base.split(".")
    if len(parts) == 3:
        c, g, gb = _field(parts[0], "c"), _field(parts[1], "g"), _field(parts[2], "gb")
    elif len(parts) == 2:
        g, gb = _field(parts[0], "g"), _field(parts[1], "gb")
        c = g
    else:
        raise ProfileFormatError("expected '<g>g.<gb>gb' or '<c>c.<g>g.<gb>gb'")
    attributes = _attributes(attrs) if attrs is not None else ()
    return ProfileName(g, gb, c, attributes, bool(minus))


def profile_or_none(text: str) -> ProfileName | None:
    try:
        return parse_profile(text)
    except ProfileFormatError:
        return None
