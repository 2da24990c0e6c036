"""Every kind of input file, handed a FIFO, a device node, a loop of symbolic links or a
passphrase-protected key: one ConfigError sentence naming the path, at once (the CLI's exit
code 2), never a hang or a prompt. Each reader is run on a thread with a deadline, so a
reader that blocks fails the test instead of hanging it."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.base.configfile import read_bytes
from nodeagent.base.errors import ConfigError
from nodeagent.dra import checkpoint
from nodeagent.kube.kubeconfig import configure
from nodeagent.kube.transport import Configuration
from nodeagent.metrics.webconfig import load_web_config
from nodeagent.sim.statefile import load_state

TLS = Path(__file__).parents[1] / "fixtures" / "tls"
DEADLINE_SECONDS = 10.0


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _loop(tmp: Path) -> Path:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return tmp / "a"


HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (_fifo, "it is a FIFO, not a file"),
    "dev-null": (lambda _tmp: Path("/dev/null"), "it is a character device, not a file"),
    "link-loop": (_loop, "a loop of symbolic links"),
}


def _kubeconfig(tmp: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }  # fmt: skip
    (tmp / "kubeconfig").write_text(yaml.safe_dump(doc))
    return str(tmp / "kubeconfig")


def _web(tmp: Path, cert: Path, key: Path) -> Path:
    (tmp / "web.yml").write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return tmp / "web.yml"


def _kube(tmp: Path, cluster: dict[str, Any], user: dict[str, Any]) -> None:
    configure(Configuration(), _kubeconfig(tmp, cluster, user), 5.0, threading.Event())


READERS: dict[str, Callable[[Path, Path], object]] = {
    "config file": lambda _tmp, p: read_bytes(str(p), "MIG config file"),
    "DRA checkpoint": lambda _tmp, p: checkpoint.load(p),
    "emulator state file": lambda _tmp, p: load_state(p),
    "web config cert_file": lambda tmp, p: load_web_config(_web(tmp, p, TLS / "plain.key")),
    "web config key_file": lambda tmp, p: load_web_config(_web(tmp, TLS / "cert.crt", p)),
    "kubeconfig certificate-authority": lambda tmp, p: _kube(
        tmp, {"certificate-authority": str(p)}, {"token": "t"}
    ),
    "kubeconfig client-key": lambda tmp, p: _kube(
        tmp, {}, {"client-certificate": str(TLS / "cert.crt"), "client-key": str(p)}
    ),
    "kubeconfig tokenFile": lambda tmp, p: _kube(tmp, {}, {"tokenFile": str(p)}),
}


def _within_deadline(call: Callable[[], object]) -> BaseException | None:
    """What `call` raised (None: it returned); fails the test when it blocks."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_SECONDS)
    assert outcome, f"the reader blocked for more than {DEADLINE_SECONDS:g} s"
    return outcome[0]


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("reader", READERS)
def test_a_hostile_input_file_is_one_sentence_naming_it(
    tmp_path: Path, reader: str, hostile: str
) -> None:
    make, words = HOSTILE[hostile]
    path = make(tmp_path)
    err = _within_deadline(lambda: READERS[reader](tmp_path, path))
    assert isinstance(err, ConfigError), repr(err)
    assert err.exit_code == 2
    assert words in str(err) and str(path) in str(err)
    assert "Errno" not in str(err) and "Traceback" not in str(err)


def test_a_passphrase_protected_key_is_refused_without_a_prompt(tmp_path: Path) -> None:
    encrypted = TLS / "encrypted.key"
    err = _within_deadline(lambda: load_web_config(_web(tmp_path, TLS / "cert.crt", encrypted)))
    assert isinstance(err, ConfigError)
    assert "protected by a passphrase" in str(err) and "key_file" in str(err)
    user = {"client-certificate": str(TLS / "cert.crt"), "client-key": str(encrypted)}
    err = _within_deadline(lambda: _kube(tmp_path, {}, user))
    assert isinstance(err, ConfigError) and "protected by a passphrase" in str(err)
    inline = {
        "client-certificate-data": base64.b64encode((TLS / "cert.crt").read_bytes()).decode(),
        "client-key-data": base64.b64encode(encrypted.read_bytes()).decode(),
    }
    err = _within_deadline(lambda: _kube(tmp_path, {}, inline))
    assert isinstance(err, ConfigError) and "protected by a passphrase" in str(err)


def test_the_unencrypted_key_loads(tmp_path: Path) -> None:
    config = load_web_config(_web(tmp_path, TLS / "cert.crt", TLS / "plain.key"))
    assert config.tls is not None
    cfg = Configuration()
    user = {"client-certificate": str(TLS / "cert.crt"), "client-key": str(TLS / "plain.key")}
    configure(cfg, _kubeconfig(tmp_path, {}, user), 5.0, threading.Event())
    assert Path(cfg.cert_file).read_bytes() == (TLS / "cert.crt").read_bytes()
