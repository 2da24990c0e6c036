"""Text from files and flags reaches a terminal only escaped and capped: the CLI's error printer
and the console log renderer both show it through logs.printable; error sentences list at most
ten items (logs.listing, which cuts the console log's lists too)."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator

import pytest
import structlog

from nodeagent.base.logs import (
    MAX_LINE_CHARS,
    MAX_LINES,
    configure_logging,
    get_logger,
    listing,
    printable,
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcödé, 中文", "plain text, ünïcödé, 中文"),
        ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
        ("bell\x07 cr\r del\x7f nel\x85", "bell\\x07 cr\\x0d del\\x7f nel\\x85"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("bidi \u202eevil\u202c", "bidi \\u202eevil\\u202c"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("lone \udcff surrogate", "lone \\udcff surrogate"),
        ("tag \U000e0041", "tag \\U000e0041"),
        ("two\nlines", "two\\x0alines"),
    ],
)
def test_unsafe_characters_are_shown_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_newlines_kept_where_they_separate_problems() -> None:
    assert printable("2 errors:\n  a\x1b\n  b", keep_newlines=True) == "2 errors:\n  a\\x1b\n  b"


def test_a_long_line_is_cut_with_a_count() -> None:
    shown = printable("x" * (MAX_LINE_CHARS + 9_990))
    assert shown == "x" * MAX_LINE_CHARS + "… (9,990 more characters)"


def test_many_lines_are_cut_with_a_count() -> None:
    shown = printable("\n".join(f"l{i}" for i in range(MAX_LINES + 100)), keep_newlines=True)
    assert shown.splitlines()[-1] == "… and 100 more lines"
    assert len(shown.splitlines()) == MAX_LINES + 1


@pytest.mark.parametrize(
    ("items", "shown"),
    [
        ([], "none"),
        (["a"], "a"),
        ([str(i) for i in range(10)], "0, 1, 2, 3, 4, 5, 6, 7, 8, 9"),
        ([str(i) for i in range(10_000)], "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 … and 9,990 more"),
    ],
)
def test_listing_caps_items(items: list[str], shown: str) -> None:
    assert listing(items) == shown


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """The console log renderer writing to a buffer; the logging configuration restored."""
    before = structlog.get_config()
    err, real = io.StringIO(), sys.stderr
    sys.stderr = err
    try:
        configure_logging("info", "console")
        yield err
    finally:
        sys.stderr = real
        structlog.configure(**before)


def test_the_console_log_shows_values_escaped_and_lists_capped(console: io.StringIO) -> None:
    get_logger("t").warning(
        "config.refused", name="\x1b[2Jevil\u2028", names=[f"c{i}" for i in range(10_000)]
    )
    line = console.getvalue()
    assert line.count("\n") == 1  # one event, one line
    assert "\x1b[2J" not in line and "\u2028" not in line
    assert "\\x1b[2Jevil\\u2028" in line
    assert "c19" in line and "c20'" not in line and "… and 9,980 more" in line
