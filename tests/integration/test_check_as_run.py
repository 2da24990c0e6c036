"""`config check` passes exactly what `run` takes: the files `run` reads before it starts (the
web config with its TLS files, the kubeconfig with its fields and files) are checked by the
one function both call (nodeagent.agent.service.check_inputs). A setting `check` passed and `run`
then refused (a passphrase-protected key, a FIFO as the certificate, a kubeconfig field of
the wrong type) was a check that proved nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result, assert_one_error

TLS = Path(__file__).parents[1] / "fixtures" / "tls"
RUN = ("--simulate", "h200", "run", "--metrics-address", "127.0.0.1:0")


def _web(tmp: Path, key: Path, cert: Path = TLS / "cert.crt") -> list[str]:
    (tmp / "web.yml").write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return ["--web.config.file", str(tmp / "web.yml")]


def _fifo_cert(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "cert.fifo")
    return _web(tmp, TLS / "plain.key", tmp / "cert.fifo")


def _kubeconfig(tmp: Path) -> list[str]:
    (tmp / "kc").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 5}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return ["--kube", "--node-name", "n", "--kubeconfig", str(tmp / "kc")]


CASES: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    "passphrase-key": (
        lambda tmp: _web(tmp, TLS / "encrypted.key"),
        ("protected by a passphrase",),
    ),
    "fifo-cert": (_fifo_cert, ("cert_file", "it is a FIFO, not a file")),
    "kubeconfig-server-int": (_kubeconfig, ("server must be a string, not int 5",)),
}


@pytest.mark.parametrize("case", CASES)
def test_what_run_refuses_config_check_refuses_alike(
    tmp_path: Path, cli: Callable[..., Result], case: str
) -> None:
    make, words = CASES[case]
    flags = make(tmp_path)
    checked = cli("config", "check", *flags)
    assert_one_error(checked, 2, *words)
    ran = cli(*RUN, *flags)
    assert_one_error(ran, 2, *words)


def test_what_check_passes_run_takes(tmp_path: Path, cli: Callable[..., Result]) -> None:
    flags = _web(tmp_path, TLS / "plain.key")
    assert cli("config", "check", *flags).returncode == 0
