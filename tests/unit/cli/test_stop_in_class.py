"""A stop signal that lands while a class is being made (a lazy import inside a command: a
dataclass's fields) is a stop, not an internal error: Python before 3.12 wraps what a
descriptor's __set_name__ raises in a RuntimeError (found by the stop-signal sweep, which
got `internal error: RuntimeError: Error calling __set_name__ on 'Field' instance`)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from nodeagent.cli import stoppable
from nodeagent.cli.commands import execute, parse
from nodeagent.cli.stops import Stopped, Stops


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """execute() points the logs at this test's captured stderr: put the suite's back, or a
    later test's agent thread in this worker logs to a closed file."""
    before = structlog.get_config()
    yield
    structlog.configure(**before)


class _StopsWhenNamed:
    def __set_name__(self, owner: type, name: str) -> None:
        raise Stopped(signal.SIGINT)


def _make_a_class(_ctx: Any) -> int:
    type("Made", (), {"field": _StopsWhenNamed()})
    return 0


def test_a_stop_inside_a_class_creation_exits_as_a_stop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def prepare() -> tuple[str, Any]:
        args = parse(["--simulate", "h200", "status"])
        assert not isinstance(args, int)
        args.func = _make_a_class
        return "status", lambda stops: execute(args, "nodeagent", stops)

    assert stoppable(prepare, in_process=True) == 128 + signal.SIGINT
    assert "internal error" not in capsys.readouterr().err


def test_an_internal_error_is_still_one(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--simulate", "h200", "status"])
    assert not isinstance(args, int)

    def broken(_ctx: Any) -> int:
        raise RuntimeError("a bug") from ValueError("under it")

    args.func = broken
    assert execute(args, "nodeagent", Stops()) == 4
    assert "internal error: RuntimeError: a bug" in capsys.readouterr().err
