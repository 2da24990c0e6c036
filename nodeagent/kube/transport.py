"""The official Kubernetes client's HTTP layer, and nothing else of the `kubernetes` package.

nodeagent sends plain JSON, so of the client it needs the `Configuration` (host, TLS, proxy,
token and its refresh hook), `rest.RESTClientObject` (the urllib3 pool that sends requests) and
`ApiException`. Importing them the ordinary way runs `kubernetes/__init__.py` first, which
imports the config loaders, the dynamic client, streams, informers and leader election
(oauthlib, requests, websocket-client, jsonschema), and `ApiClient` imports pydantic: 16 MiB of
the agent's memory for code it never calls. `_load()` imports the three modules with the
package folders standing in, for the time of that import, for the packages `kubernetes`,
`kubernetes.client` and `kubernetes.utils`; the real packages stay importable (their
`__init__` runs the first time someone imports them, and reuses the modules loaded here).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

PACKAGES = ("kubernetes", "kubernetes.client", "kubernetes.utils")
MODULES = ("kubernetes.client.configuration", "kubernetes.client.rest")
USER_AGENT = "nodeagent (kubernetes-client rest)"


def _load() -> dict[str, types.ModuleType]:
    """The client's configuration, rest and exceptions modules."""
    if not all(m in sys.modules for m in MODULES):
        spec = importlib.util.find_spec("kubernetes")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the kubernetes client package is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
        stand_ins = []
        for name in PACKAGES:
            if name not in sys.modules:
                folder = root.joinpath(*name.split(".")[1:])
                package = types.ModuleType(name)
                package.__path__ = [str(folder)]
                package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
                sys.modules[name] = package
                stand_ins.append(name)
        try:
            for module in MODULES:
                importlib.import_module(module)
        finally:
            for name in stand_ins:
                del sys.modules[name]
    return {m: sys.modules[m] for m in (*MODULES, "kubernetes.client.exceptions")}


_modules = _load()
if TYPE_CHECKING:
    from kubernetes.client.configuration import Configuration as Configuration
    from kubernetes.client.exceptions import ApiException as ApiException
else:
    Configuration = _modules["kubernetes.client.configuration"].Configuration
    ApiException = _modules["kubernetes.client.exceptions"].ApiException
_RESTClientObject: Any = _modules["kubernetes.client.rest"].RESTClientObject


class Transport:
    """Requests through the client's REST layer: URL from the Configuration's host, the bearer
    token from its api_key (its refresh hook runs first), JSON bodies."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self.rest = _RESTClientObject(configuration)

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        stream: bool = False,
    ) -> Any:
        """The JSON answer as Python data, or with `stream` the open urllib3 response (a
        watch). Raises ApiException (the client's own, with status and body) on an answer that
        is not 2xx, urllib3's errors for a connection that failed or timed out."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        auth = self.configuration.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["authorization"] = auth["value"]
        url = self.configuration.host + path
        pairs = [(k, v) for k, v in (query or {}).items() if v is not None]
        if pairs:
            url += "?" + urlencode(pairs)
        response = self.rest.request(
            method, url, headers=headers, body=body, _request_timeout=timeout
        )
        if stream and 200 <= response.status <= 299:
            return response.response
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=response, body=data.decode("utf-8", "replace"), data=None
            )
        return json.loads(data) if data else None

    def close(self) -> None:
        self.rest.close()


def json_lines(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON objects of a watch, one a line, as they arrive (urllib3 response)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
