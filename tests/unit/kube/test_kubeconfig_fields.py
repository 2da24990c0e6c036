"""A kubeconfig's fields of the wrong type or encoding are refused when the file is read, each
named (all at once), never answered with Python's exception text nor left to fail (and be
retried) at every request."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.base.errors import ConfigError
from nodeagent.kube.kubeconfig import configure
from nodeagent.kube.transport import Configuration

GOOD_CLUSTER = {"server": "https://127.0.0.1:6443"}


def _doc(cluster: Any = None, user: Any = None, **top: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": GOOD_CLUSTER if cluster is None else cluster}],
        "users": [{"name": "u", "user": {"token": "t"} if user is None else user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        **top,
    }  # fmt: skip


CORPUS = {
    "server-int": (
        _doc(cluster={"server": 5}),
        "clusters[0].cluster.server must be a string, not int 5",
    ),
    "server-no-url": (_doc(cluster={"server": "127.0.0.1"}), "server must be an http(s) URL"),
    "token-int": (_doc(user={"token": 12}), "users[0].user.token must be a string, not int 12"),
    "token-newline": (_doc(user={"token": "a\nb"}), "token must be printable ASCII"),
    "token-non-ascii": (_doc(user={"token": "t\u00e9"}), "token must be printable ASCII"),
    "clusters-string": (_doc(clusters="x"), "clusters must be a list, not str 'x'"),
    "user-list": (_doc(user=["a"]), "users[0].user must be a mapping, not a list"),
    "ca-not-base64": (
        _doc(cluster={**GOOD_CLUSTER, "certificate-authority-data": "!!notbase64"}),
        "certificate-authority-data is not base64",
    ),
    "ca-not-pem": (
        _doc(cluster={**GOOD_CLUSTER, "certificate-authority-data": "aGVsbG8="}),
        "certificate-authority-data holds no PEM block",
    ),
    "skip-tls-string": (
        _doc(cluster={**GOOD_CLUSTER, "insecure-skip-tls-verify": "yes"}),
        "insecure-skip-tls-verify must be true or false, not str 'yes'",
    ),
    "exec-args-int": (
        _doc(user={"exec": {"command": "x", "args": [1]}}),
        "user.exec.args[0] must be a string",
    ),
    "current-context-int": (_doc(**{"current-context": 5}), "current-context must be a string"),
    "name-int": ({**_doc(), "users": [{"name": 3, "user": {}}]}, "users[0].name must be a string"),
}


@pytest.mark.parametrize("case", CORPUS)
def test_a_field_of_the_wrong_type_or_encoding_is_one_error_naming_it(
    tmp_path: Path, case: str
) -> None:
    doc, words = CORPUS[case]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    with pytest.raises(ConfigError) as err:
        configure(Configuration(), str(path), 5.0, threading.Event())
    assert words in str(err.value) and str(path) in str(err.value)
    assert "object has no attribute" not in str(err.value)
    assert "object is not" not in str(err.value)


def test_every_problem_of_the_file_is_named_at_once(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(_doc(cluster={"server": 5}, user={"token": 12})))
    with pytest.raises(ConfigError) as err:
        configure(Configuration(), str(path), 5.0, threading.Event())
    assert "server must be a string" in str(err.value) and "token must be a string" in str(
        err.value
    )


def test_a_good_kubeconfig_configures_the_client(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(_doc()))
    cfg = Configuration()
    configure(cfg, str(path), 5.0, threading.Event())
    assert cfg.host == "https://127.0.0.1:6443"
    assert "Bearer t" in cfg.api_key.values()
