"""A kubeconfig's fields, typed before the Kubernetes client sees them. Pure but for the files
it names, which are read here (nodeagent.base.files: regular, bounded) and put inline.

The client's `KubeConfigLoader` takes any YAML value: `server: 5` or a `token: 12` came back
as Python's own text ("'int' object has no attribute ..."), and a certificate that was no
certificate or a token with a line break passed the loader and failed every request after,
retried for ever. Here every field the client reads is checked for its type and encoding, all
problems of the file at once, and a file it names (`certificate-authority`,
`client-certificate`, `client-key`, `tokenFile`) is read through the one opener and handed
over as its `-data` (the client would open a FIFO there and wait for ever).
"""

from __future__ import annotations

import base64
import binascii
import copy
import os
import ssl
import tempfile
from typing import Any
from urllib.parse import urlsplit

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import read_input

MAX_TLS_FILE_BYTES = 1 << 20
STRING, BOOL, LIST, MAPPING = "a string", "true or false", "a list", "a mapping"
_TYPES: dict[str, tuple[type, ...]] = {STRING: (str,), BOOL: (bool,), LIST: (list,),
                                       MAPPING: (dict,)}  # fmt: skip
CLUSTER = {"server": STRING, "certificate-authority": STRING,
           "certificate-authority-data": STRING, "insecure-skip-tls-verify": BOOL,
           "tls-server-name": STRING, "proxy-url": STRING}  # fmt: skip
USER = {"client-certificate": STRING, "client-certificate-data": STRING, "client-key": STRING,
        "client-key-data": STRING, "token": STRING, "tokenFile": STRING, "username": STRING,
        "password": STRING, "exec": MAPPING, "auth-provider": MAPPING}  # fmt: skip
CONTEXT = {"cluster": STRING, "user": STRING, "namespace": STRING}
EXEC = {"command": STRING, "args": LIST, "env": LIST, "apiVersion": STRING,
        "provideClusterInfo": BOOL, "interactiveMode": STRING}  # fmt: skip
# (file key, its -data key, what it is)
FILES = (
    ("certificate-authority", "certificate-authority-data", "certificate authority"),
    ("client-certificate", "client-certificate-data", "client certificate"),
    ("client-key", "client-key-data", "client key"),
)


def server_problem(server: Any) -> str | None:
    """What makes `server` no URL the client can connect to ('must be ...', 'has port ...'),
    None for a good one: http(s), a host, a port in 1..65535, brackets closed."""
    wanted = "must be an http(s) URL such as https://10.0.0.1:6443"
    if not isinstance(server, str):
        return f"{wanted}, not {_shown(server)}"
    if not server.isprintable() or any(c.isspace() for c in server):
        return f"{wanted}, not {_shown(server)} (it holds spaces or control characters)"
    try:
        parts = urlsplit(server)
        port = parts.port
        host = parts.hostname
    except ValueError as err:  # 'Invalid IPv6 URL', 'Port out of range 0-65535'
        if "port" in str(err).lower():
            return f"has a port outside 1..65535: {server!r}"
        return f"{wanted}, not {server!r} (an IPv6 address goes in closed brackets: [::1])"
    if parts.scheme not in ("http", "https") or not host:
        return f"{wanted}, not {server!r}"
    if port == 0:
        return f"has a port outside 1..65535: {server!r}"
    if parts.query or parts.fragment:
        return f"{wanted}, not {server!r} (no ?query or #fragment)"
    return None


def _shown(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _check(entry: dict[str, Any], fields: dict[str, str], where: str, out: list[str]) -> None:
    for key, wanted in fields.items():
        value = entry.get(key)
        if value is None:
            continue
        if not isinstance(value, _TYPES[wanted]) or (wanted != BOOL and isinstance(value, bool)):
            out.append(f"{where}.{key} must be {wanted}, not {_shown(value)}")


def _entries(doc: dict[str, Any], key: str, fields: dict[str, str], out: list[str]) -> None:
    entries = doc.get(key)
    if entries is None:
        return
    if not isinstance(entries, list):
        out.append(f"{key} must be a list, not {_shown(entries)}")
        return
    inner = key[:-1]
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            out.append(f"{where} must be a mapping, not {_shown(entry)}")
            continue
        if not isinstance(entry.get("name"), str):
            out.append(f"{where}.name must be a string, not {_shown(entry.get('name'))}")
        body = entry.get(inner)
        if body is None:
            continue
        if not isinstance(body, dict):
            out.append(f"{where}.{inner} must be a mapping, not {_shown(body)}")
            continue
        _check(body, fields, f"{where}.{inner}", out)
        if inner == "user" and isinstance(body.get("exec"), dict):
            _exec(body["exec"], f"{where}.user.exec", out)


def _exec(spec: dict[str, Any], where: str, out: list[str]) -> None:
    _check(spec, EXEC, where, out)
    for i, arg in enumerate(spec.get("args") or [] if isinstance(spec.get("args"), list) else []):
        if not isinstance(arg, str):
            out.append(f"{where}.args[{i}] must be a string, not {_shown(arg)}")
    env = spec.get("env") if isinstance(spec.get("env"), list) else []
    for i, item in enumerate(env or []):
        if not (isinstance(item, dict) and all(
            isinstance(item.get(k), str) for k in ("name", "value")
        )):  # fmt: skip
            out.append(f"{where}.env[{i}] must be a mapping of a string name and value")


def _selected(doc: dict[str, Any], key: str, name: Any) -> dict[str, Any] | None:
    for entry in doc.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(key[:-1])
            return body if isinstance(body, dict) else None
    return None


def _decoded(value: str, where: str, out: list[str]) -> bytes | None:
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        out.append(f"{where} is not base64")
        return None


def _pem(data: bytes, where: str, out: list[str]) -> None:
    if b"-----BEGIN " not in data:
        out.append(f"{where} holds no PEM block (-----BEGIN ...)")


def _inline_files(body: dict[str, Any], where: str, base: str, out: list[str]) -> None:
    """Each file the client would open, read here and put inline as its -data; each -data
    checked to be base64 of PEM text."""
    for file_key, data_key, what in FILES:
        if isinstance(body.get(data_key), str):
            raw = _decoded(body[data_key], f"{where}.{data_key}", out)
            if raw is not None:
                _pem(raw, f"{where}.{data_key}", out)
        elif isinstance(body.get(file_key), str):
            path = os.path.join(base, body.pop(file_key))
            try:
                raw = read_input(path, f"kubeconfig {what}", MAX_TLS_FILE_BYTES)
            except ConfigError as err:
                out.append(f"{where}.{file_key}: {err}")
                continue
            _pem(raw, f"{where}.{file_key} {path}", out)
            body[data_key] = base64.b64encode(raw).decode()
    if isinstance(body.get("tokenFile"), str) and "token" not in body:
        path = os.path.join(base, body.pop("tokenFile"))
        try:
            raw = read_input(path, "kubeconfig token file", MAX_TLS_FILE_BYTES)
        except ConfigError as err:
            out.append(f"{where}.tokenFile: {err}")
            return
        try:
            body["token"] = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            out.append(f"{where}.tokenFile {path} is not ASCII text")
    token = body.get("token")
    if isinstance(token, str) and not (token.isascii() and token.isprintable() and token.strip()):
        out.append(f"{where}.token must be printable ASCII (a bearer token), not {_shown(token)}")


def _data(body: dict[str, Any], key: str) -> bytes | None:
    value = body.get(key)
    return base64.b64decode("".join(value.split())) if isinstance(value, str) else None


def _load_tls(cluster: dict[str, Any], user: dict[str, Any], out: list[str]) -> None:
    """Load the CA and the client certificate and key as the connection pool will: one that
    is none, a key that does not match or is protected by a passphrase is named here, never
    a prompt nor a failure of every request (each one retried)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca = _data(cluster, "certificate-authority-data")
    try:
        if ca is not None:
            ctx.load_verify_locations(cadata=ca.decode("ascii"))
    except (ValueError, ssl.SSLError):
        out.append("the cluster's certificate authority holds no PEM certificate")
    cert, key = _data(user, "client-certificate-data"), _data(user, "client-key-data")
    if cert is None or key is None:
        return
    asked: list[bool] = []

    def no_passphrase() -> bytes:  # OpenSSL would ask on the terminal and wait
        asked.append(True)
        return b""

    with tempfile.TemporaryDirectory(prefix="nodeagent-tls-") as folder:  # mode 0700
        paths = (os.path.join(folder, "cert"), os.path.join(folder, "key"))
        for path, data in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            ctx.load_cert_chain(*paths, password=no_passphrase)
        except (OSError, ssl.SSLError) as err:
            out.append(
                "the user's client key is protected by a passphrase; give an unencrypted key"
                if asked
                else "the user's client certificate and key do not load (not PEM, or not a"
                f" pair): {getattr(err, 'reason', None) or err}"
            )


def typed_kubeconfig(document: dict[str, Any], path: str, base: str) -> dict[str, Any]:
    """A copy of the kubeconfig the client can load: every field it reads of the right type,
    the current context's cluster and user with their files inline. Raises ConfigError
    naming the file and every problem (one per line)."""
    doc = copy.deepcopy(document)
    out: list[str] = []
    for key in ("current-context", "apiVersion", "kind"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            out.append(f"{key} must be a string, not {_shown(doc[key])}")
    _entries(doc, "clusters", CLUSTER, out)
    _entries(doc, "users", USER, out)
    _entries(doc, "contexts", CONTEXT, out)
    if not out:
        context = _selected(doc, "contexts", doc.get("current-context")) or {}
        cluster = _selected(doc, "clusters", context.get("cluster"))
        user = _selected(doc, "users", context.get("user"))
        if cluster is not None:
            if cluster.get("server") is not None:
                problem = server_problem(cluster["server"])
                if problem:
                    out.append(f"the cluster's server {problem}")
            _inline_files(cluster, "the cluster", base, out)
        if user is not None:
            _inline_files(user, "the user", base, out)
        if not out:
            _load_tls(cluster or {}, user or {}, out)
    if out:
        shown = out[0] if len(out) == 1 else "\n  " + "\n  ".join(out[:20])
        raise ConfigError(f"kubeconfig {path}: {shown}")
    return doc
