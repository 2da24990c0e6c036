"""Structured logging: JSON lines in a container, readable console output on a terminal.

Loggers are lazy: structlog is imported and configured on the first log call, so a one-shot
command that logs nothing (`nodeagent status`) never pays for it (structlog's import pulls in
asyncio, and rich where installed: ~80 ms).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_wanted: tuple[str, str] = ("info", "auto")
_applied = False


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
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
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
