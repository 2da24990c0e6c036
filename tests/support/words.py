"""The promise for bad input, as one assertion: the documented exit code, one line on stderr
holding the expected words, no traceback, no "internal error", and none of the words of
Python, urllib3, OpenSSL or PyYAML that a user should never have to read."""

from __future__ import annotations

import re

from tests.support.cli import Result

# Each one came out of nodeagent once (issue 39, class 10).
FOREIGN = (
    "NewConnectionError",
    "MaxRetryError",
    "ProtocolError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "LocationParseError",
    "SSLError",
    "ReaderError",
    "ConstructorError",
    "invalid literal for int() with base",
    "key None",
    "Traceback",
    "internal error",
    "<unicode string>",
    "could not determine a constructor",
    "Invalid kube-config file",
)
FOREIGN_PATTERNS = (
    re.compile(r"\(_ssl\.c:\d+\)"),  # OpenSSL's source line
    re.compile(r"\[Errno \d+\]"),  # an OSError's repr
    re.compile(r"(?<![\w'])b'[^']*'"),  # a bytes repr: b'hello'
    re.compile(r"object has no attribute"),
)


def foreign_words(text: str) -> list[str]:
    """The words of `text` that are Python's (or its libraries'), not ours."""
    found = [w for w in FOREIGN if w in text]
    return found + [m.group(0) for p in FOREIGN_PATTERNS for m in p.finditer(text)]


def assert_our_words(res: Result, code: int, *words: str) -> str:
    """`res` failed with `code` and one stderr line holding every word and no foreign word;
    returns that line."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert foreign_words(res.stderr) == [], res.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
