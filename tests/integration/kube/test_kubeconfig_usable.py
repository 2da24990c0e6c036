"""A kubeconfig `run` cannot use is refused by `config check --kubeconfig` and by `run` alike
(nodeagent.kube.kubeconfig.check_kubeconfig is their one validation): one sentence in our
words, exit 2, before any request. Each case once escaped: `config check` passed it and `run`
retried for 30 s, or either answered "internal error" (a loop of links, an open bracket) or
hung (a billion laughs as the current-context)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result
from tests.support.words import assert_our_words

LAUGHS = "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(10)
)


def kubeconfig(
    server: str = "https://127.0.0.1:6443",
    current: str | None = "current-context: c\n",
    kind: str = "Config",
    clusters: str | None = None,
    context_cluster: str = "k",
    user: str = "{token: abc}",
    head: str = "",
) -> str:
    clusters = clusters or f'[{{name: k, cluster: {{server: "{server}"}}}}]'
    return (
        f"{head}apiVersion: v1\nkind: {kind}\n{current or ''}clusters: {clusters}\n"
        f"contexts: [{{name: c, context: {{cluster: {context_cluster}, user: u}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
    )


def _loop(tmp: Path) -> str:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return str(tmp / "a")


def _file(text: str) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        (tmp / "kc").write_text(text)
        return str(tmp / "kc")

    return make


TWO = '[{name: k, cluster: {server: "https://a:1"}}, {name: k, cluster: {server: "https://b:1"}}]'
CASES: dict[str, tuple[Callable[[Path], str], tuple[str, ...]]] = {
    "link-loop": (_loop, ("kubeconfig", "loop of symbolic links")),
    "open-bracket": (_file(kubeconfig("https://[::1:6443")), ("server", "closed brackets")),
    "port-99999": (_file(kubeconfig("https://127.0.0.1:99999")), ("port outside 1..65535",)),
    "port-0": (_file(kubeconfig("https://127.0.0.1:0")), ("port outside 1..65535",)),
    "no-cluster-of-the-name": (_file(kubeconfig(context_cluster="zz")), ("cluster 'zz'",)),
    "two-clusters-one-name": (_file(kubeconfig(clusters=TWO)), ("two clusters", "'k'")),
    "no-current-context": (_file(kubeconfig(current=None)), ("no current-context",)),
    "current-context-unknown": (
        _file(kubeconfig(current="current-context: other\n")),
        ("current-context 'other'",),
    ),
    "kind-pod": (_file(kubeconfig(kind="Pod")), ("kind is 'Pod'", "no kubeconfig")),
    "exec-without-command": (
        _file(kubeconfig(user="{exec: {apiVersion: client.authentication.k8s.io/v1}}")),
        ("exec plugin has no command",),
    ),
    "laughs-as-current-context": (
        _file(kubeconfig(current="current-context: *l9\n", head=LAUGHS)),
        ("billion laughs",),
    ),
    "laughs-as-the-file": (_file(LAUGHS), ("billion laughs",)),
    "binary-token": (_file(kubeconfig(user="{token: !!binary aGVsbG8=}")), ("'!!binary'",)),
    "python-tag": (
        _file(kubeconfig(user="{token: !!python/object:os.system x}")),
        ("not allowed in a kubeconfig",),
    ),
    "int-tag-of-text": (_file(kubeconfig(user="{token: !!int abc}")), ("not a valid int",)),
    "alias-holding-itself": (_file("a: &a [*a]\n"), ("alias", "itself")),
    "not-utf8": (lambda tmp: _file("")(tmp) and _latin1(tmp), ("not UTF-8",)),
}


def _latin1(tmp: Path) -> str:
    (tmp / "kc").write_bytes(b"# caf\xe9\n" + kubeconfig().encode())
    return str(tmp / "kc")


@pytest.mark.parametrize("command", ["config-check", "run"])
@pytest.mark.parametrize("case", CASES)
def test_a_kubeconfig_run_cannot_use_is_refused_by_check_and_run_alike(
    tmp_path: Path, cli: Callable[..., Result], case: str, command: str
) -> None:
    where, words = CASES[case]
    path = where(tmp_path)
    args = ["--kube", "--node-name", "n", "--kubeconfig", path]
    if command == "run":
        args += ["--metrics-address", "127.0.0.1:0"]
    started = time.monotonic()
    words_of = ("run",) if command == "run" else ("config", "check")
    res = cli("--simulate", "h200", *words_of, *args)
    assert_our_words(res, 2, *words)
    assert time.monotonic() - started < 10  # refused before any request, never retried


def test_a_good_kubeconfig_passes_config_check(tmp_path: Path, cli: Callable[..., Result]) -> None:
    (tmp_path / "kc").write_text(kubeconfig())
    os.symlink(tmp_path / "kc", tmp_path / "link")  # a ConfigMap mounts it as a link
    res = cli("--simulate", "h200", "config", "check", "--kube", "--node-name", "n",
              "--kubeconfig", str(tmp_path / "link"))  # fmt: skip
    assert res.returncode == 0, res.stderr
