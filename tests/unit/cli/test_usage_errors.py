"""A usage error (a flag argparse refuses) is a failure like any other: exit 2, argparse's
words on stderr, and with `--output json` the same {error, reason, retry} on stdout."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.support.cli import Result


@pytest.mark.parametrize(
    "args, error",
    [
        (["status", "-o", "json", "--bogus"], "unrecognized arguments: --bogus"),
        (["status", "--output=json", "extra"], "unrecognized arguments: extra"),
        (["status", "-ojson", "--gpu", "1"], "unrecognized arguments: --gpu 1"),
        (["status", "--out", "json", "--bogus"], "unrecognized arguments: --bogus"),
        (["mig", "apply", "-o", "json", "--lock-timeout"], "argument --lock-timeout: expected"),
        (["sharing", "assert", "-o", "json", "-c"], "argument -c/--config: expected one argument"),
        (["--simulate", "h200", "mig", "export", "-o", "json", "-l"], "argument -l/--config-label"),
    ],
)
def test_json_usage_error(cli: Callable[..., Result], args: list[str], error: str) -> None:
    res = cli(*args)
    assert res.returncode == 2
    assert "error: " + error in res.stderr and res.stderr.startswith("usage: ")
    data = json.loads(res.stdout)
    assert data["error"].startswith(error) and data["error"] in res.stderr
    assert (data["reason"], data["retry"]) == ("bad-input", False)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--bogus"],  # text output: stdout stays empty
        ["status", "-o", "xml"],  # not json: the refused value itself
        ["status", "--", "-o", "json"],  # after --, no flag
    ],
)
def test_text_usage_error(cli: Callable[..., Result], args: list[str]) -> None:
    res = cli(*args)
    assert (res.returncode, res.stdout) == (2, "")
    assert "error: " in res.stderr
