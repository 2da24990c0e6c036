"""The web configuration file: TLS and basic auth for the metrics endpoint, in the format of
Prometheus' exporter-toolkit (`--web.config.file`, docs/web-configuration.md), so the files
node_exporter and dcgm-exporter already use work here:

    tls_server_config:
      cert_file: /etc/nodeagent/tls/tls.crt
      key_file: /etc/nodeagent/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # default NoClientCert
      client_ca_file: /etc/nodeagent/tls/ca.crt
      min_version: TLS12                             # default TLS12; max_version too
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hashes (htpasswd -nBC 10 "")

Read once at start. Keys of the toolkit that nodeagent does not implement (inline `cert`,
`key`, `client_ca`, `client_allowed_sans`, cipher and curve lists, `http_server_config`,
`rate_limit`) are refused like unknown ones: a security setting must never be ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodeagent.base.configfile import Errors, check_tags, compose, kind, mapping, read_text, scalar
from nodeagent.base.errors import ConfigError
from nodeagent.base.files import read_input

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's tls.ClientAuthType names, as the toolkit takes them: (verify mode, needs a CA file).
CLIENT_AUTH = {
    "NoClientCert": (ssl.CERT_NONE, False),
    # Go requests a certificate and checks nothing; OpenSSL cannot ask without checking, and
    # what is never checked proves nothing: not asked for.
    "RequestClientCert": (ssl.CERT_NONE, False),
    # Go takes any certificate here; OpenSSL checks it against client_ca_file (stricter).
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version")  # fmt: skip
TOOLKIT_ONLY = {
    "cert", "key", "client_ca", "client_allowed_sans", "cipher_suites",
    "prefer_server_cipher_suites", "curve_preferences", "http_server_config", "rate_limit",
}  # fmt: skip
MAX_USERS = 64
MAX_TLS_FILE_BYTES = 1 << 20  # a certificate chain is a few KiB
MAX_CACHED = 1024  # credentials that passed bcrypt once, kept to spare the next scrape ~70 ms


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None
    auth: BasicAuth | None


class BasicAuth:
    """Checks an Authorization header against bcrypt hashes; a pair that passed is cached
    (by a SHA-256 of the header and the hash), as the toolkit caches it."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        self._passed: set[bytes] = set()
        self._lock = threading.Lock()

    def known(self, header: str | None) -> bool:
        """Whether these credentials passed before (no bcrypt: cheap enough for the selector
        thread)."""
        return header is not None and self._key(header) in self._passed

    def check(self, header: str | None) -> bool:
        """Whether the `Authorization` header names a user with the right password."""
        if header is None:
            return False
        key = self._key(header)
        if key in self._passed:
            return True
        scheme, _, encoded = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        hashed = self.users.get(user.decode("utf-8", "replace"))
        if not sep or hashed is None:
            return False
        import bcrypt  # only where basic auth is configured

        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._passed) >= MAX_CACHED:
                    self._passed.clear()
                self._passed.add(key)
        return ok

    def _key(self, header: str) -> bytes:
        return hashlib.sha256(header.strip().encode("utf-8", "replace")).digest()


def load_web_config(path: Path) -> WebConfig:
    """Read, check and build the web configuration. Raises ConfigError naming file:line:col
    for every problem (unknown keys, missing files, a certificate that does not load)."""
    text = read_text(str(path), "web config file")
    source = str(path)
    root = compose(text, source, "tls_server_config and/or basic_auth_users")
    errors = Errors(source)
    check_tags(root, errors, "a web config file")
    top = _keys(root, errors, "the file", ("tls_server_config", "basic_auth_users"))
    tls_fields = _keys(top["tls_server_config"], errors, "tls_server_config", TLS_KEYS) \
        if "tls_server_config" in top else None  # fmt: skip
    users = _users(top.get("basic_auth_users"), errors)
    tls = _tls(tls_fields, errors, root) if tls_fields is not None else None
    errors.raise_if_any()
    return WebConfig(tls, BasicAuth(users) if users else None)


def _keys(node: yaml.Node, errors: Errors, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A mapping's values by key; unknown keys (and the toolkit's that nodeagent lacks) are
    errors at their position."""
    out: dict[str, Any] = {}
    for key, value in mapping(node, errors, what):
        if key.value in allowed:
            out[key.value] = value
        elif key.value in TOOLKIT_ONLY:
            errors.add(key, f"{what}: {key.value!r} is not supported by nodeagent")
        else:
            errors.add(key, f"{what} has an unknown key {key.value!r}; known: {', '.join(allowed)}")
    return out


def _text(node: yaml.Node, errors: Errors, what: str) -> str | None:
    value = scalar(node)
    if not isinstance(value, str) or not value:
        errors.add(node, f"{what} must be a non-empty string, not {kind(node)}")
        return None
    return value


def _users(node: yaml.Node | None, errors: Errors) -> dict[str, bytes]:
    if node is None or (scalar(node) is None and isinstance(node, yaml.ScalarNode)):
        return {}  # absent or empty: no basic auth, as the toolkit says
    users: dict[str, bytes] = {}
    for key, value in mapping(node, errors, "basic_auth_users"):
        hashed = _text(value, errors, f"the bcrypt hash of {key.value!r}")
        if hashed is None:
            continue
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
            errors.add(value, f"the password of {key.value!r} must be a bcrypt hash ($2y$...)")
            continue
        users[key.value] = hashed.encode()
    if len(users) > MAX_USERS:
        errors.add(node, f"basic_auth_users has {len(users)} users; at most {MAX_USERS}")
    return users


def _tls(fields: dict[str, Any], errors: Errors, root: yaml.Node) -> ssl.SSLContext | None:
    """The server's TLS context, or None after reporting what is wrong."""
    text = {k: _text(v, errors, f"tls_server_config.{k}") for k, v in fields.items()}
    for key in ("cert_file", "key_file"):
        if key not in fields:
            errors.add(root, f"tls_server_config needs {key}")
    auth = text.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        node = fields["client_auth_type"]
        errors.add(node, f"client_auth_type {auth!r} is none of {', '.join(CLIENT_AUTH)}")
        auth = "NoClientCert"
    mode, needs_ca = CLIENT_AUTH[auth]
    if needs_ca and not text.get("client_ca_file"):
        where = fields.get("client_auth_type", root)
        errors.add(where, f"client_auth_type {auth} needs client_ca_file")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = text.get(key) or default
        if name not in TLS_VERSIONS:
            errors.add(fields[key], f"{key} {name!r} is none of {', '.join(TLS_VERSIONS)}")
            name = default
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:  # no version left: no handshake
        names = {v: k for k, v in TLS_VERSIONS.items()}
        errors.add(
            fields.get("min_version", fields.get("max_version", root)),
            f"tls_server_config.min_version {names[versions['min_version']]} is above "
            f"max_version {names[versions['max_version']]}: no TLS version is left",
        )
    if errors.located:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version, ctx.maximum_version = versions["min_version"], versions["max_version"]
    except ValueError as err:  # a version this OpenSSL will not do
        errors.add(fields.get("min_version", root), f"TLS versions refused: {err}")
        return None
    asked: list[bool] = []

    def no_passphrase() -> bytes:  # OpenSSL would ask on the terminal and wait
        asked.append(True)
        return b""

    key = "cert_file"
    try:
        for key in ("cert_file", "key_file", "client_ca_file"):  # the one opener says why
            if text.get(key):
                read_input(str(text[key]), f"tls_server_config.{key}", MAX_TLS_FILE_BYTES)
        key = "key_file"
        ctx.load_cert_chain(str(text["cert_file"]), str(text["key_file"]), no_passphrase)
        key = "client_ca_file"
        if text.get(key):
            ctx.load_verify_locations(str(text[key]))
    except ConfigError as err:
        errors.add(fields[key], str(err))
        return None
    except (OSError, ssl.SSLError) as err:
        reason = getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
        if asked and key == "key_file":
            reason = "the key is protected by a passphrase; give an unencrypted key"
        where = "cert_file and key_file" if key == "key_file" else key
        errors.add(fields[key], f"tls_server_config.{where}: cannot load it: {reason}")
        return None
    ctx.verify_mode = mode
    return ctx
