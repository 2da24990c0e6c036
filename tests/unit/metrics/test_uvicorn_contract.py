"""What nodeagent.metrics.server takes from uvicorn beyond its public API: the private names
`_Protocol` (a subclass of HttpToolsProtocol) and `_Uvicorn` (of Server) use, each with the
kind and signature they rely on. A uvicorn release that moves one fails here, not in an
endpoint that misbehaves under load; pyproject.toml bounds uvicorn below the next minor."""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Callable
from typing import Any

import httptools
import pytest
import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState


def params(function: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Never called: the protocol is only built."""


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("__init__", ["config", "server_state", "app_state", "_loop"]),
        ("connection_made", ["transport"]),
        ("connection_lost", ["exc"]),
        ("eof_received", []),
        ("data_received", ["data"]),
        ("on_message_begin", []),
        ("on_url", ["url"]),
        ("on_header", ["name", "value"]),
        ("on_headers_complete", []),
        ("on_response_complete", []),
        ("_unset_keepalive_if_required", []),
    ],
)
def test_the_protocol_methods_overridden_or_called_keep_their_signature(
    method: str, expected: list[str]
) -> None:
    function = getattr(HttpToolsProtocol, method)
    assert callable(function) and not inspect.iscoroutinefunction(function)
    assert params(function) == expected


def test_the_protocol_state_read_and_written_is_where_it_was() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(app, lifespan="off", log_config=None, ws="none")
        protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        state = vars(protocol)
        for name in ("parser", "flow", "transport", "cycle", "client", "timeout_keep_alive_task",
                     "loop"):  # fmt: skip
            assert name in state, name
        assert isinstance(protocol.parser, httptools.HttpRequestParser)
        assert isinstance(protocol.pipeline, collections.deque)
        assert protocol.loop is loop
        protocol.on_message_begin()
        assert protocol.url == b""  # reset per request: the request-line limit is per request
    finally:
        loop.close()


def test_the_request_cycle_and_flow_control_keep_what_the_protocol_reads() -> None:
    assert "on_response" in params(RequestResponseCycle.__init__)
    assert "response_complete" in inspect.getsource(RequestResponseCycle.__init__)
    for method in ("pause_reading", "resume_reading"):
        assert params(getattr(FlowControl, method)) == []
    # the module still feeds the parser's leniency that pipelining needs
    assert "set_dangerous_leniencies" in inspect.getsource(httptools_impl)


def test_the_server_hooks_overridden_or_called_are_where_they_were() -> None:
    assert inspect.iscoroutinefunction(uvicorn.Server.main_loop)
    assert params(uvicorn.Server.main_loop) == []
    assert "sockets" in params(uvicorn.Server.serve)
    assert "main_loop" in inspect.getsource(uvicorn.Server._serve)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_config=None))
    assert isinstance(server.server_state.connections, set)
    assert server.force_exit is False
    for option in ("http", "lifespan", "log_config", "access_log", "proxy_headers", "ws",
                   "server_header", "date_header", "backlog", "timeout_keep_alive",
                   "ssl_context_factory"):  # fmt: skip
        assert option in params(uvicorn.Config.__init__), option
