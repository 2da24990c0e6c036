"""The in-cluster service account, read by nodeagent (as the client's loader does, with the
token and CA read as small regular files): host, CA, token, the token read again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.kube import kubeconfig
from nodeagent.kube.api import KubeSettings, make_api_client

TLS = Path(__file__).parents[2] / "fixtures" / "tls"


@pytest.fixture
def account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "token").write_text("first-token\n")
    (tmp_path / "ca.crt").write_bytes((TLS / "cert.crt").read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


def _settings(folder: Path | str) -> KubeSettings:
    return KubeSettings(node_name="n", service_account_dir=str(folder))


def test_the_service_account_configures_host_ca_and_token(
    account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_api_client(_settings(account)).configuration
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.ssl_ca_cert == str(account / "ca.crt")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer first-token"
    # The kubelet rotates the token; it is read again once the refresh period passed.
    (account / "token").write_text("second-token\n")
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer first-token"
    monkeypatch.setattr(kubeconfig, "TOKEN_REFRESH_SECONDS", 0.0)
    assert cfg.auth_settings()["BearerToken"]["value"] == "Bearer second-token"


def test_an_ipv6_service_host_is_bracketed(account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert make_api_client(_settings(account)).configuration.host == "https://[fd00::1]:443"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: os.environ.pop("KUBERNETES_SERVICE_HOST"), "KUBERNETES_SERVICE_HOST"),
        (lambda d: (d / "token").unlink(), "cannot read service account token"),
        (lambda d: (d / "token").write_text("\n"), "token"),
        (lambda d: (d / "ca.crt").write_text(""), "CA"),
        (
            lambda d: (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n"),
            "no PEM certificate",
        ),
        (lambda d: (d / "token").write_text("t\u00e9\n"), "not printable ASCII"),
        (lambda d: (d / "token").write_text("a\x07b\n"), "not printable ASCII"),
        (
            lambda d: (
                os.symlink(d / "loop", d / "loop")
                or (d / "token").unlink()
                or (d / "token").symlink_to(d / "loop")
            ),
            "loop of symbolic links",
        ),
        (
            lambda d: (
                os.mkfifo(d / "fifo") or (d / "token").unlink() or (d / "fifo").rename(d / "token")
            ),
            "not a file",
        ),
    ],
    ids=[
        "no-env",
        "no-token",
        "empty-token",
        "empty-ca",
        "not-a-ca",
        "non-ascii-token",
        "control-char-token",
        "token-link-loop",
        "fifo-token",
    ],
)
def test_a_service_account_that_cannot_be_used_is_one_sentence(
    account: Path, change: object, words: str
) -> None:
    change(account)  # type: ignore[operator]
    with pytest.raises(ConfigError) as err:
        make_api_client(_settings(account))
    assert words in str(err.value) and "\n" not in str(err.value)
