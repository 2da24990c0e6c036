"""Where the Kubernetes client's credentials come from: a kubeconfig file (read by nodeagent:
bounded, checked, its exec plugin run with a timeout), or the in-cluster service account.

The client's own loader reads the file without a size cap (`/dev/zero` fills the memory; a FIFO
blocks for ever) and runs a kubeconfig's exec credential plugin (`users[].user.exec`: `aws eks
get-token`, `gke-gcloud-auth-plugin`, ...) with no timeout at all: a plugin that hangs held the
agent, SIGTERM included. Here the file is read once (configfile.read_bytes: bounded, regular),
and handed to the client's `KubeConfigLoader` without its `exec` stanza; the plugin runs under
`ExecPlugin` (the client.authentication.k8s.io ExecCredential protocol), with a timeout, killed
when the agent stops, and again before its token expires.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nodeagent.base.commands import kill_group
from nodeagent.base.configfile import load_plain, read_bytes, read_text
from nodeagent.base.errors import ConfigError, KubeError
from nodeagent.base.logs import get_logger
from nodeagent.kube.kubeconfig_fields import typed_kubeconfig

log = get_logger("nodeagent.kube")
REFRESH_MARGIN_SECONDS = 60.0  # a token is fetched again this long before it expires
POLL_SECONDS = 0.1


def read_kubeconfig(path: str) -> dict[str, Any]:
    """The kubeconfig as a mapping, read through the one opener and the one YAML reader
    (bounded in size and aliases; plain values only). Raises ConfigError naming the path."""
    text = read_text(path, "kubeconfig")
    document = load_plain(text, f"kubeconfig {path}", "a kubeconfig")
    if not isinstance(document, dict):
        raise ConfigError(f"kubeconfig {path} must be a mapping (apiVersion: v1, kind: Config)")
    return document


def _base(path: str) -> str:
    """The folder relative paths in the kubeconfig start from (the file's own, links
    resolved: a ConfigMap mounts the file as a link into its data folder)."""
    try:
        return str(Path(path).resolve().parent)
    except (OSError, RuntimeError):  # a loop made after the read: the folder as named
        return os.path.dirname(os.path.abspath(path))


def _by_name(document: dict[str, Any], key: str, out: list[str]) -> dict[str, dict[str, Any]]:
    """The entries of `key` (clusters, contexts, users) by name; a name given twice is a
    problem (the client refuses it: it cannot tell which is meant)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in document.get(key) or []:
        name = entry.get("name")
        if name in found:
            out.append(f"two {key} are named {name!r}; each name must be given once")
        found[name] = entry
    return found


def _usable(document: dict[str, Any]) -> list[str]:
    """What keeps the client from using a typed kubeconfig (kubectl's `ConfirmUsable`): no
    current-context, a context, cluster or user it names that is not there (or is there
    twice), a kind that is no Config, a current user's exec plugin without a command."""
    out: list[str] = []
    kind, version = document.get("kind"), document.get("apiVersion")
    if kind not in (None, "", "Config"):
        out.append(f"kind is {kind!r}, not Config: this is no kubeconfig")
    if version not in (None, "", "v1"):
        out.append(f"apiVersion is {version!r}; a kubeconfig is v1")
    clusters = _by_name(document, "clusters", out)
    contexts = _by_name(document, "contexts", out)
    users = _by_name(document, "users", out)
    current = document.get("current-context")
    if not current:
        out.append("no current-context: name the context to use (kubectl config use-context)")
        return out
    if current not in contexts:
        out.append(f"current-context {current!r} names no context in the file")
        return out
    context = contexts[current].get("context") or {}
    cluster, user = context.get("cluster"), context.get("user")
    if not cluster:
        out.append(f"context {current!r} names no cluster")
    elif cluster not in clusters:
        out.append(f"context {current!r} names cluster {cluster!r}, which the file does not hold")
    elif not (clusters[cluster].get("cluster") or {}).get("server"):
        out.append(f"cluster {cluster!r} has no server")
    if user and user not in users:
        out.append(f"context {current!r} names user {user!r}, which the file does not hold")
    spec = ((users.get(user) or {}).get("user") or {}).get("exec") if user else None
    if isinstance(spec, dict) and not spec.get("command"):
        out.append(f"user {user!r}: its exec plugin has no command")
    return out


def check_kubeconfig(path: str) -> dict[str, Any]:
    """The kubeconfig at `path` as the client will load it (every field typed, the files it
    names read and put inline), checked the way `run` uses it: the one validation of `run`
    and `config check --kubeconfig`. Raises ConfigError naming the file and every problem."""
    document = read_kubeconfig(path)
    typed = typed_kubeconfig(document, path, _base(path))
    problems = _usable(typed)
    if problems:
        shown = problems[0] if len(problems) == 1 else "\n  " + "\n  ".join(problems)
        raise ConfigError(f"kubeconfig {path}: {shown}")
    return typed


def _named(document: dict[str, Any], key: str, name: Any) -> dict[str, Any]:
    for entry in document.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            inner = entry.get(key[:-1])  # contexts[].context, users[].user, clusters[].cluster
            return inner if isinstance(inner, dict) else {}
    return {}


def split_exec(document: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, Any]:
    """(the kubeconfig without the current user's `exec`, that exec stanza where the client
    would use it, the current context's cluster entry). The client tries a user's
    auth-provider, token and tokenFile before exec: where one is there, exec is not run."""
    doc = copy.deepcopy(document)
    context = _named(doc, "contexts", doc.get("current-context"))
    user = _named(doc, "users", context.get("user"))
    spec = user.pop("exec", None)
    if spec is None or any(k in user for k in ("auth-provider", "token", "tokenFile")):
        return doc, None, None
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str):  # checked before
        raise ConfigError("kubeconfig: the user's exec plugin needs a command (a string)")
    return doc, spec, _named(doc, "clusters", context.get("cluster"))


class ExecPlugin:
    """A kubeconfig's exec credential plugin: run with a timeout, stopped with the agent."""

    def __init__(
        self,
        spec: dict[str, Any],
        cluster: dict[str, Any],
        cwd: str,
        timeout_seconds: float,
        stop: threading.Event,
    ) -> None:
        self.spec, self.cluster, self.cwd = spec, cluster, cwd
        self.timeout_seconds = timeout_seconds
        self.stop_event = stop
        self.expires_at: float | None = None  # time.time() of the token's expiry, if given
        self._lock = threading.Lock()
        self.command = str(spec["command"])

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for item in self.spec.get("env") or []:
            if isinstance(item, dict) and "name" in item:
                env[str(item["name"])] = str(item.get("value", ""))
        info: dict[str, Any] = {
            "apiVersion": self.spec.get("apiVersion", ""),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        if self.spec.get("provideClusterInfo"):
            info["spec"]["cluster"] = self.cluster
        env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
        return env

    def run(self) -> dict[str, Any]:
        """The plugin's `status` (token or client certificate). Raises KubeError when it cannot
        be started, fails, answers nonsense, runs past the timeout, or the agent stops."""
        args = [self.command, *[str(a) for a in self.spec.get("args") or []]]
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=self.cwd or None, env=self._environment(), start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            raise KubeError(f"kubeconfig exec plugin {self.command}: {err.strerror}") from err
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            try:
                out, err_text = proc.communicate(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                if self.stop_event.is_set() or time.monotonic() >= deadline:
                    kill_group(proc)  # the plugin and whatever it started
                    if self.stop_event.is_set():
                        raise KubeError(
                            f"kubeconfig exec plugin {self.command}: ended, the agent is stopping"
                        ) from None
                    raise KubeError(
                        f"kubeconfig exec plugin {self.command} did not answer within"
                        f" {self.timeout_seconds:g} s"
                    ) from None
        if proc.returncode != 0:
            last = (err_text.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
            raise KubeError(
                f"kubeconfig exec plugin {self.command} failed (exit {proc.returncode})"
                + (f": {last[:300]}" if last else "")
            )
        try:
            status = json.loads(out)["status"]
            if not isinstance(status, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError, RecursionError) as err:
            raise KubeError(
                f"kubeconfig exec plugin {self.command} did not answer an ExecCredential"
            ) from err
        self.expires_at = _expiry(status.get("expirationTimestamp"))
        return status

    def install(self, cfg: Any) -> None:
        """Run the plugin now and put its credential into the client's Configuration; with a
        token that expires, run it again before each request made within
        REFRESH_MARGIN_SECONDS of the expiry."""
        self._apply(cfg, self.run())
        if self.expires_at is not None:
            cfg.refresh_api_key_hook = self.refresh

    def refresh(self, cfg: Any) -> None:
        with self._lock:
            if self.expires_at is None or time.time() < self.expires_at - REFRESH_MARGIN_SECONDS:
                return
            log.info("kube.exec_refresh", command=self.command)
            self._apply(cfg, self.run())

    def _apply(self, cfg: Any, status: dict[str, Any]) -> None:
        if "token" in status:
            cfg.api_key["BearerToken"] = f"Bearer {status['token']}"
        elif "clientCertificateData" in status and "clientKeyData" in status:
            # Read once: the connection pool takes the files when the ApiClient is built.
            cfg.cert_file = _private_file(status["clientCertificateData"])
            cfg.key_file = _private_file(status["clientKeyData"])
            self.expires_at = None
        else:
            raise KubeError(
                f"kubeconfig exec plugin {self.command} answered neither a token nor a client"
                " certificate"
            )


def _expiry(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _private_file(data: Any) -> str:
    fd, name = tempfile.mkstemp(prefix="nodeagent-exec-")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write(str(data))
    return name


def configure(cfg: Any, path: str, exec_timeout_seconds: float, stop: threading.Event) -> None:
    """Fill the client's Configuration `cfg` from the kubeconfig at `path`. Raises ConfigError
    for the file, KubeError for its exec plugin."""
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader

    document = check_kubeconfig(path)
    base = _base(path)  # relative paths in it (an exec plugin's): from its folder
    doc, spec, cluster = split_exec(document)
    try:
        KubeConfigLoader(config_dict=doc, config_base_path=base).load_and_set(cfg)
    except ConfigException as err:  # the loader's own sentences (no context, no user)
        raise ConfigError(
            f"cannot configure the Kubernetes client from kubeconfig {path}: {err}"
        ) from err
    if spec is not None:
        ExecPlugin(spec, cluster, base, exec_timeout_seconds, stop).install(cfg)


TOKEN_REFRESH_SECONDS = 60.0  # bound service account tokens rotate; the kubelet rewrites the file


def configure_in_cluster(cfg: Any, folder: str) -> None:
    """The pod's service account: the API server from KUBERNETES_SERVICE_HOST/PORT, the CA and
    the token from `folder` (read as regular files of bounded, by configfile), the token read again
    every TOKEN_REFRESH_SECONDS. Raises ConfigError (one sentence) where something is missing."""
    where = "the in-cluster service account"
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            f"cannot configure the Kubernetes client from {where}: KUBERNETES_SERVICE_HOST and"
            " KUBERNETES_SERVICE_PORT are not set (not in a pod? give --kubeconfig)"
        )
    ca = os.path.join(folder, "ca.crt")
    ca_pem = read_bytes(ca, "service account CA")
    if not ca_pem.strip():
        raise ConfigError(f"service account CA {ca} is empty")
    try:
        ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    except (ValueError, ssl.SSLError) as err:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"service account CA {ca} holds no PEM certificate") from err
    token_file = os.path.join(folder, "token")

    def token() -> str:
        value = read_bytes(token_file, "service account token").decode("ascii", "replace").strip()
        if not value:
            raise ConfigError(f"service account token {token_file} is empty")
        if not value.isprintable() or "\ufffd" in value:
            raise ConfigError(
                f"service account token {token_file} is not printable ASCII (a bearer token)"
            )
        return "Bearer " + value

    cfg.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    cfg.ssl_ca_cert = ca
    cfg.api_key["BearerToken"] = token()
    read_at = [time.monotonic()]

    def refresh(c: Any) -> None:
        if time.monotonic() - read_at[0] < TOKEN_REFRESH_SECONDS:
            return
        read_at[0] = time.monotonic()
        try:
            c.api_key["BearerToken"] = token()
        except ConfigError as err:  # the last token may still be good: keep it, say so
            log.warning("kube.token_unreadable", error=str(err))

    cfg.refresh_api_key_hook = refresh
