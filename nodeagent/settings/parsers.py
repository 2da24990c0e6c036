"""Parsers: a raw value (a YAML scalar, the text of a variable or flag) -> a typed value, or
Invalid with the rest of one sentence."""

from __future__ import annotations

import ipaddress
import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeagent.base.errors import ConfigError
from nodeagent.base.units import is_digits as _digits  # ASCII digits, at most 18
from nodeagent.settings.groups import DEFAULT_METRICS_ADDRESS

# -- parsers: raw value (YAML scalar or the text of a variable/flag) -> typed value ----------


class Invalid(ValueError):
    """A value a parser refuses; the message completes 'WHERE: ' (e.g. 'must be > 0')."""


Parser = Callable[[Any], Any]


def _text(raw: Any) -> str:
    if isinstance(raw, (dict, list)) or raw is None or isinstance(raw, bool):
        raise Invalid(f"must be a string, not {_show(raw)}")
    if isinstance(raw, (bytes, bytearray)):
        raise Invalid("must be text, not binary data")
    text = str(raw)
    if "\x00" in text:  # no path, name or command may hold a NUL byte
        raise Invalid("must not contain a NUL byte")
    control = next((c for c in text if _control(c)), None)
    if control is not None:  # a terminal escape, a bell, a line break in a name or a path
        raise Invalid(f"must not contain control characters (U+{ord(control):04X})")
    return text


def _control(char: str) -> bool:
    """A C0 or C1 control character, or DEL; a tab is text."""
    code = ord(char)
    return char != "\t" and (code < 0x20 or 0x7F <= code < 0xA0)


def _show(raw: Any) -> str:
    if isinstance(raw, dict):
        return "a mapping"
    if isinstance(raw, list):
        return "a list"
    if raw is None:
        return "empty"
    return repr(raw) if isinstance(raw, str) else str(raw)


FLOOR_SECONDS = 0.01  # shorter would spin a core (and hold the NVML lock) for nothing
CEILING_SECONDS = 7 * 86400.0  # longer overflows socket timeouts and is surely a typo


def seconds(minimum: float = 0.0, inclusive: bool = False) -> Parser:
    """A finite number of seconds above `minimum` (at or above it when `inclusive`), at least
    FLOOR_SECONDS when not 0 and at most CEILING_SECONDS."""

    def parse(raw: Any) -> float:
        if isinstance(raw, bool):
            raise Invalid(f"must be a number of seconds, not {raw}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise Invalid(f"must be a number of seconds, not {_show(raw)}") from None
        bound = f"at least {minimum:g}" if inclusive else f"> {minimum:g}"
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise Invalid(f"must be a finite number of seconds {bound}, not {_show(raw)}")
        if 0 < value < FLOOR_SECONDS:
            raise Invalid(f"must be at least {FLOOR_SECONDS:g} s, not {_show(raw)}")
        if value > CEILING_SECONDS:
            raise Invalid(f"must be at most {CEILING_SECONDS:g} s (7 days), not {_show(raw)}")
        return value

    return parse


def integer(minimum: int, maximum: int | None = None) -> Parser:
    def parse(raw: Any) -> int:
        if isinstance(raw, (bool, float)):
            raise Invalid(f"must be a whole number, not {_show(raw)}")
        digits = str(raw).strip()
        try:
            if not _digits(digits.lstrip("+-")) or len(digits) > 18:
                raise ValueError(digits)
            value = int(digits)
        except ValueError:
            raise Invalid(f"must be a whole number, not {_show(raw)}") from None
        if value < minimum or (maximum is not None and value > maximum):
            span = f"{minimum}-{maximum}" if maximum is not None else f">= {minimum}"
            raise Invalid(f"must be {span}, not {value}")
        return value

    return parse


def optional(parse: Parser) -> Parser:
    """'' (or an empty YAML value) means unset."""

    def parse_optional(raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        return parse(raw)

    return parse_optional


def boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise Invalid(f"must be true or false, not {_show(raw)}")


def text(raw: Any) -> str:
    value = _text(raw).strip()
    if not value:
        raise Invalid("must not be empty")
    return value


def path(raw: Any) -> Path:
    return Path(text(raw))


def choice(*options: str) -> Parser:
    def parse(raw: Any) -> str:
        value = _text(raw).strip().lower()
        if value not in options:
            raise Invalid(f"must be one of {', '.join(options)}, not {_show(raw)}")
        return value

    return parse


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_PREFIX = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def label_prefix(raw: Any) -> str:
    """A Kubernetes label-key prefix: a DNS subdomain (lowercase, at most 253 characters)
    and a '/', e.g. nvidia.com/ or gpu.example.com/."""
    value = text(raw)
    if not _LABEL_PREFIX.match(value) or len(value) > 254:
        raise Invalid(
            f"must be a DNS subdomain followed by '/', e.g. nvidia.com/ or gpu.example.com/,"
            f" not {value!r}"
        )
    return value


def address(raw: Any) -> str:
    value = text(raw)
    try:
        parse_address(value)
    except ConfigError as err:
        raise Invalid(str(err)) from None
    return value


def parse_address(value: str) -> tuple[str, int]:
    """'HOST:PORT', '[IPV6]:PORT' or ':PORT' (all IPv4 interfaces) -> (host, port). HOST may be
    a name, resolved when the server binds. Raises ConfigError naming the value."""
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    host_ok = _is_ipv6(host) if bracketed else not any(c in host for c in ":[] \t")
    if not (sep and host_ok and _digits(port) and int(port) <= 65535):
        raise ConfigError(
            f"metrics address {value!r} must be HOST:PORT, [IPV6]:PORT or :PORT,"
            f" e.g. {DEFAULT_METRICS_ADDRESS}"
        )
    return host or "0.0.0.0", int(port)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def devices(raw: Any) -> tuple[int, ...]:
    items = raw if isinstance(raw, list) else _text(raw).split(",")
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        if isinstance(item, bool) or not _digits(str(item).strip()):
            raise Invalid(f"must be GPU indices like 0,1, not {_show(raw)}")
        out.append(int(str(item).strip()))
    if not out:
        raise Invalid("must name at least one GPU index")
    if len(set(out)) != len(out):
        raise Invalid(f"lists a GPU twice: {out}")
    return tuple(out)


def size(raw: Any) -> str:
    """A size in the MPS daemon's notation (2G, 2048M, 512MiB), at least 1 MiB."""
    from nodeagent.base.units import parse_size

    value = _text(raw).strip()
    try:
        if parse_size(value) < 1 << 20:
            raise Invalid(f"{value!r} is under 1 MiB (the daemon takes whole MiB)")
    except ConfigError:
        raise Invalid(f"{value!r} is not a size like 2G, 2048M or 512MiB") from None
    return value


def pinned_memory(raw: Any) -> str:
    """'2G' or '0=2G,1=4G' (a YAML mapping {0: 2G} too); sizes are checked against the GPUs
    when MPS is resolved."""
    if isinstance(raw, dict):
        parts = []
        for key, value in raw.items():
            if isinstance(key, bool) or not _digits(str(key)):
                raise Invalid(f"keys must be GPU indices, not {_show(key)}")
            parts.append(f"{key}={_text(value).strip()}")
        raw = ",".join(parts)
    value = text(raw)
    seen: set[int] = set()
    parts = value.split(",")
    for part in parts:
        index, sep, amount = part.rpartition("=")
        if (sep and not _digits(index.strip())) or (not sep and len(parts) > 1):
            raise Invalid(f"must be SIZE or INDEX=SIZE,..., not {value!r}")
        if sep and int(index) in seen:
            raise Invalid(f"gives GPU {int(index)} twice: {value!r}")
        seen.add(int(index) if sep else -1)
        size(amount)
    return value


def selector(raw: Any) -> dict[str, str]:
    """'app=x,tier=y' (or a YAML mapping) -> {'app': 'x', 'tier': 'y'}."""
    if isinstance(raw, dict):
        if not raw:
            raise Invalid("selector must not be empty")
        return {text(k): _text(v).strip() for k, v in raw.items()}
    out = {}
    for part in _text(raw).split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise Invalid(f"selector {_show(raw)} must be key=value[,key=value]")
        out[key.strip()] = value.strip()
    return out


def _items(raw: Any) -> list[Any]:
    """A YAML list, or a text of items separated by ';' (a variable) or given one per flag."""
    if isinstance(raw, list):
        return raw
    return [p for p in _text(raw).split(";") if p.strip()]


_COMPONENT = re.compile(r"^[a-z]([-a-z0-9.]*[a-z0-9])?$")
COMPONENT_FORM = "NAME or NAME=KEY=VALUE[,KEY=VALUE]"


def _component(name: Any) -> str:
    value = _text(name).strip()
    if not _COMPONENT.match(value) or len(value) > 40:
        raise Invalid(
            f"component {_show(name)} must be {COMPONENT_FORM}, NAME a lowercase word such as"
            " device-plugin (its label is nvidia.com/gpu.deploy.NAME)"
        )
    return value


def components(raw: Any) -> dict[str, dict[str, str]]:
    """NAME[=SELECTOR] items (';'-separated in a variable, a list or a mapping in a file); an
    empty value pauses nothing."""
    if isinstance(raw, dict):
        return {
            _component(name): {} if sel in (None, "", {}) else selector(sel)
            for name, sel in raw.items()
        }
    if raw is None:
        return {}
    out: dict[str, dict[str, str]] = {}
    for item in _items(raw):
        name, sep, sel = _text(item).partition("=")
        if sep and not sel.strip():
            raise Invalid(f"{_show(item)} must be {COMPONENT_FORM}")
        out[_component(name)] = selector(sel) if sep else {}
    return out


def label_key(raw: Any) -> str:
    """A Kubernetes label key with a prefix (example.com/name) whose `<key>.state` is one too."""
    value = text(raw)
    prefix, sep, name = value.rpartition("/")
    if (
        not sep
        or not _LABEL_PREFIX.match(prefix + "/")
        or len(prefix) > 253
        or not _LABEL_NAME.match(name + ".state")
        or len(name + ".state") > 63
    ):
        raise Invalid(
            f"must be a label key such as nvidia.com/mig.config (a DNS prefix, '/', a name of"
            f" at most 57 characters), not {_show(raw)}"
        )
    return value


def driver_name(raw: Any) -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (gpu.example.com)."""
    value = text(raw)
    if len(value) > 63 or "." not in value or not _LABEL_PREFIX.match(value + "/"):
        raise Invalid(
            f"must be a DNS subdomain of at most 63 characters such as gpu.nodeagent.io,"
            f" not {_show(raw)}"
        )
    return value


FALLBACKS = ("named", "single", "empty")  # config-manager's fallback strategies


# The recovery actions' names (nodeagent.state.recovery.ACTION_NAMES, a floor above: a test
# keeps the two the same), or a number for an action this nodeagent does not know.
RECOVERY_ACTIONS = (
    "gpu-reset", "node-reboot", "drain-p2p", "drain-and-reset", "recover-imex-domain",
    "bus-reset", "system-reboot",
)  # fmt: skip
FAULT = re.compile(
    r"^(xid|xid-[1-9][0-9]{0,5}|ecc-uncorrected|row-remap-pending|row-remap-failure|recovery"
    rf"|recovery-({'|'.join(RECOVERY_ACTIONS)}|[1-9][0-9]{{0,2}}))$"
)


def faults(raw: Any) -> tuple[str, ...]:
    """Fault kinds (nodeagent.state.faults): xid (every XID), xid-<code>, ecc-uncorrected,
    row-remap-pending, row-remap-failure, recovery (every recovery action the driver reports),
    recovery-<action>; a list, or a text separated by ','; empty: none."""
    items = raw if isinstance(raw, list) else _text(raw).split(",")
    out = tuple(_text(i).strip().lower() for i in items if _text(i).strip())
    for item in out:
        if not FAULT.match(item):
            raise Invalid(
                "must list xid, xid-<code>, ecc-uncorrected, row-remap-pending,"
                " row-remap-failure, recovery or recovery-<action> (gpu-reset, node-reboot,"
                f" ...), not {_show(item)}"
            )
    return out


def xids(raw: Any) -> tuple[int, ...]:
    """XID codes (1-999999): a list, or a text separated by ','; empty: none."""
    items = raw if isinstance(raw, list) else _text(raw).split(",")
    out: list[int] = []
    for item in items:
        text = _text(item).strip()
        if isinstance(item, str) and not text:
            continue
        if isinstance(item, bool) or not _digits(text) or not 1 <= int(text) <= 999_999:
            raise Invalid(f"must be XID codes like 13,31, not {_show(raw)}")
        out.append(int(text))
    return tuple(sorted(set(out)))


def fallbacks(raw: Any) -> tuple[str, ...]:
    """config-manager's FALLBACK_STRATEGIES: named, single, empty, in order (a list, or a
    text separated by ',' as the Helm chart joins them, or ';'); empty: none."""
    items = raw if isinstance(raw, list) else _text(raw).replace(",", ";").split(";")
    out = tuple(_text(i).strip().lower() for i in items if _text(i).strip())
    for item in out:
        if item not in FALLBACKS:
            raise Invalid(f"must list {', '.join(FALLBACKS)}, not {_show(item)}")
    return out


def selectors(raw: Any) -> tuple[dict[str, str], ...]:
    return tuple(selector(item) for item in _items(raw))


def command(raw: Any) -> str:
    """A command line, split as a shell would (no shell runs it)."""
    value = text(raw)
    try:
        argv = shlex.split(value)
    except ValueError as err:
        raise Invalid(f"command {_show(raw)} cannot be split: {err}") from err
    if not argv:
        raise Invalid("must name a command")
    return value


def commands(raw: Any) -> tuple[str, ...]:
    """Command lines: a YAML list, or a text of commands separated by ';'."""
    items = tuple(command(item) for item in _items(raw))
    if not items:
        raise Invalid("must name at least one command")
    return items


def socket(raw: Any) -> Path | None:
    """A socket path; '' means do not ask the kubelet."""
    return None if raw is None or not _text(raw).strip() else Path(_text(raw).strip())
