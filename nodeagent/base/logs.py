"""Structured logging: JSON lines in a container, readable console output on a terminal.

Loggers are lazy: structlog is imported and configured on the first log call, so a one-shot
command that logs nothing (`nodeagent status`) never pays for it (structlog's import pulls in
asyncio, and rich where installed: ~80 ms).
"""

from __future__ import annotations

import logging
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_wanted: tuple[str, str] = ("info", "auto")
_applied = False
MAX_LINE_CHARS = 2000
MAX_LINES = 25
MAX_ITEMS = 20  # items of a list in a console log line
MAX_LISTED = 10  # items named in an error sentence
# Control characters (a terminal escape, a carriage return), format characters (bidi
# overrides, zero widths), line and paragraph separators (U+2028/2029: a line break to YAML
# and to JavaScript) and lone surrogates (bytes that were not UTF-8: unprintable).
_UNSAFE = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def _escape(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` safe for a terminal and one log line: every control, format or separator
    character shown as Python writes it (ESC as `\\x1b`, U+2028 as `\\u2028`), a line over
    MAX_LINE_CHARS cut with a count, and (keeping newlines) at most MAX_LINES lines. The CLI's
    error printer and the console log renderer both show text through this."""
    lines = text.split("\n") if keep_newlines else [text]
    shown = []
    for line in lines[:MAX_LINES]:
        safe = "".join(_escape(c) if unicodedata.category(c) in _UNSAFE else c for c in line)
        if len(safe) > MAX_LINE_CHARS:
            more = len(safe) - MAX_LINE_CHARS
            safe = f"{safe[:MAX_LINE_CHARS]}… ({more:,} more characters)"
        shown.append(safe)
    if len(lines) > MAX_LINES:
        shown.append(f"… and {len(lines) - MAX_LINES:,} more lines")
    return "\n".join(shown)


def capped(items: Iterable[Any], limit: int) -> tuple[list[Any], int]:
    """The first `limit` items and how many more there are."""
    shown: list[Any] = []
    more = 0
    for item in items:
        if len(shown) < limit:
            shown.append(item)
        else:
            more += 1
    return shown, more


def listing(items: Iterable[str], limit: int = MAX_LISTED, empty: str = "none") -> str:
    """Items for an error sentence: at most `limit`, then how many more (`a, b … and 9,990
    more`); `empty` when there are none."""
    shown, more = capped(items, limit)
    if not shown:
        return empty
    return ", ".join(shown) + (f" … and {more:,} more" if more else "")


def _short(value: Any) -> Any:
    """A log field's value as the console shows it: text made printable, long lists cut."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        shown, more = capped(value, MAX_ITEMS)
        return [_short(v) for v in shown] + ([f"… and {more:,} more"] if more else [])
    return value


def _console_safe(_logger: Any, _method: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """structlog processor before the console renderer: it prints text as it is."""
    return {key: _short(value) for key, value in event.items()}


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Send structlog events to stderr at `level`; `fmt` is json, console or auto (tty).
    Applied now if structlog is loaded already, else at the first log call."""
    global _wanted
    _wanted = (level, fmt)
    if "structlog" in sys.modules:
        _apply()


def _apply() -> None:
    global _applied
    import structlog

    level, fmt = _wanted
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    # JSON escapes every control character itself (and every non-ASCII one).
    renderer: list[Any] = (
        [structlog.processors.JSONRenderer()]
        if use_json
        else [_console_safe, structlog.dev.ConsoleRenderer()]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level.lower()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _applied = True


class _Logger:
    """Stands in for a structlog logger until the first call."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            import structlog

            if not _applied:
                _apply()
            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def get_logger(name: str) -> Any:
    """A logger for `name` (an event name plus key/value fields per call)."""
    return _Logger(name)
