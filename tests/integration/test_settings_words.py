"""A settings file with values no setting takes is one sentence at its position, in our words
(the same loader serves `run`, `config check` and the SIGHUP reload): control characters, YAML
tags, keys that are lists, binary values and aliases were answered with `key None`,
`b'info'`, `invalid literal for int() with base 10`, or PyYAML's text with `<unicode string>`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result
from tests.support.words import assert_our_words

HEAD = "version: nodeagent/v1\n"
LAUGHS = "".join(
    f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(10)
)
CASES = {
    "bell": ('node:\n  log-level: "in\\afo"\n', ("node.log-level", "control characters (U+0007)")),
    "escape": ('node:\n  log-level: "\\e[31mred"\n', ("control characters (U+001B)",)),
    "line-break-in-path": (
        'mig:\n  hooks-file: "/etc/a\\nb"\n',
        ("mig.hooks-file", "control characters (U+000A)"),
    ),
    "binary-value": ("node:\n  log-level: !!binary aW5mbw==\n", ("'!!binary'", "3:14")),
    "binary-address": ("metrics:\n  address: !!binary AAEC\n", ("'!!binary'", "metrics.address")),
    "custom-tag": ("node:\n  log-level: !custom info\n", ("tag '!custom' is not allowed",)),
    "python-tag": ("node:\n  log-level: !!python/object:os.system x\n", ("not allowed",)),
    "int-tag-of-text": ("node:\n  log-level: !!int abc\n", ("'abc' is not a valid int",)),
    "set-tag": ("metrics:\n  address: !!set {a, b}\n", ("'!!set'",)),
    "bad-timestamp": ("metrics:\n  address: !!timestamp 2001-99-99\n", ("not a valid timestamp",)),
    "list-as-key": ("? [a, b]\n: 1\n", ("2:3", "a key must be a name, not a list")),
    "list-as-key-in-group": ("node:\n  ? [a]\n  : info\n", ("a key in node must be a name",)),
    "alias-holding-itself": ("node: &x\n  log-level: *x\n", ("alias", "itself")),
    "billion-laughs": ("x:\n" + LAUGHS, ("billion laughs",)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_settings_value_no_setting_takes_is_one_sentence_in_our_words(
    tmp_path: Path, cli: Callable[..., Result], case: str
) -> None:
    text, words = CASES[case]
    (tmp_path / "na.yaml").write_text(HEAD + text)
    res = cli("config", "check", "--config", str(tmp_path / "na.yaml"))
    assert_our_words(res, 2, *words)
