"""Requests to the API server through the official client's `ApiClient`.

nodeagent reads and writes Kubernetes objects as JSON (dicts), so it uses the client the way
the generated API classes do underneath: `ApiClient.param_serialize` (URL, query, headers, the
bearer token through the Configuration's refresh hook, the body) and `ApiClient.call_api` (the
urllib3 pool, TLS, proxy), and `ApiException` for an answer that is not 2xx. The typed API
classes (`CoreV1Api`, `ResourceV1Api`, ...) are not used: since kubernetes 37 each call is
validated with pydantic and their import loads the model classes, 27 MiB more of the agent's
memory (72 MiB against 45 MiB for `ApiClient` alone, measured with kubernetes 37.0.2) and
0.5 s more of start-up, for objects the agent reads as dicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from nodeagent.metrics.kube import KUBE_REQUESTS

ApiException = client.ApiException
Configuration = client.Configuration
USER_AGENT = "nodeagent (kubernetes-client)"


class Transport:
    """The API server's JSON answers through one `ApiClient` (its connection pool)."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self.api = client.ApiClient(configuration)
        self.api.user_agent = USER_AGENT

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
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, body, post = self.api.param_serialize(
            method,
            path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        watch = str((query or {}).get("watch", "")).lower() == "true"
        try:
            response = self.api.call_api(method, url, headers, body, post, _request_timeout=timeout)
        except Exception:
            KUBE_REQUESTS.add(method, path, watch, "error")
            raise
        KUBE_REQUESTS.add(method, path, watch, str(response.status))
        if stream and 200 <= response.status <= 299:
            return response.response
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=response, body=data.decode("utf-8", "replace"), data=None
            )
        return json.loads(data) if data else None

    def close(self) -> None:
        self.api.close()


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
