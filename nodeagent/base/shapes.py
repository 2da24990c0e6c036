"""The JSON shapes of the API objects the agent reads, checked before any field is read.

The API server validates what it stores, but a newer API version, a buggy controller or an
emulated API server can hand the agent any JSON: `status.allocation.devices` a list, a
`results` that is a string. Each reader declares the shape of the fields it reads, once, and
`check` says in one sentence which field is wrong, so one object that cannot be read is
skipped (an informer) or refused (a kubelet's claim) and never reaches code that would fail
on it with Python's words.

A shape is a JSON type (`str`, `int`, `bool`, `dict`, `list`, `object` for anything), a
tuple of them (any of), a `{key: shape}` dict (an object whose listed keys, where present
and not null, have those shapes; other keys are not read), `[shape]` (a list of such items)
or `MapOf(shape)` (an object of such values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from nodeagent.base.errors import ConfigError

_INDEX = re.compile(r"\[\d+\]")


@dataclass(frozen=True)
class MapOf:
    """An object whose every value has `value`'s shape (labels, capacities)."""

    value: Shape


Shape: TypeAlias = type | tuple[type, ...] | dict[str, "Shape"] | list["Shape"] | MapOf


class Unreadable(ConfigError):
    """An object of the wrong shape. `field`: the first wrong field's path, its list indices
    left out (`status.devices[].data`: a metric's label, one value per field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = _INDEX.sub("[]", field)


_NAMES = {str: "a string", int: "a number", float: "a number", bool: "true or false"}
_NAMES.update({dict: "an object", list: "a list", type(None): "null"})


def _kind(value: object) -> str:
    return _NAMES.get(type(value), "a " + type(value).__name__)


def _expected(shape: Shape) -> str:
    if isinstance(shape, dict | MapOf):
        return "an object"
    if isinstance(shape, list):
        return "a list"
    types = shape if isinstance(shape, tuple) else (shape,)
    # An int field holding 1000.0 "is a number, not a whole number" (never "not a number").
    names = {"a whole number" if t is int else _NAMES.get(t, t.__name__) for t in types}
    return " or ".join(sorted(names))


def _fits(value: object, types: tuple[type, ...]) -> bool:
    if object in types:
        return True
    if isinstance(value, bool):  # JSON true is no number
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def problem(value: object, shape: Shape, path: str = "") -> tuple[str, str] | None:
    """(the first wrong field's path, what it is instead of what it should be), or None when
    `value` has `shape`. Iterative: a value nested 100,000 deep costs no recursion."""
    stack: list[tuple[object, Shape, str]] = [(value, shape, path)]
    while stack:
        value, shape, path = stack.pop()
        if isinstance(shape, dict | MapOf):
            if not isinstance(value, Mapping):
                return path or "the object", f"is {_kind(value)}, not an object"
            if isinstance(shape, MapOf):
                items = [(k, shape.value) for k in value]
            else:
                items = [(k, s) for k, s in shape.items() if value.get(k) is not None]
            for key, sub in reversed(items):
                stack.append((value[key], sub, f"{path}.{key}" if path else str(key)))
        elif isinstance(shape, list):
            if not isinstance(value, list):
                return path or "the object", f"is {_kind(value)}, not a list"
            for i in reversed(range(len(value))):
                stack.append((value[i], shape[0], f"{path}[{i}]"))
        else:
            types = shape if isinstance(shape, tuple) else (shape,)
            if not _fits(value, types):
                return path, f"is {_kind(value)}, not {_expected(shape)}"
    return None


def check(value: object, shape: Shape, what: str) -> None:
    """Raise Unreadable ("<what>: <field> is a list, not an object") unless `value` has
    `shape`."""
    found = problem(value, shape)
    if found is not None:
        field, how = found
        raise Unreadable(f"{what}: {field} {how}", field)
