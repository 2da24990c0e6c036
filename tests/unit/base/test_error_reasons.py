"""Every error class says its consequence (retry or refused) and a reason; the DRA refusals
metric counts by that reason, and a failed `--output json` command prints it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base import errors
from nodeagent.dra.node import reason_of
from tests.support.cli import Result

CLASSES = [
    c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.AgentError)
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_error_class_has_a_reason_and_a_consequence(cls: type[errors.AgentError]) -> None:
    assert cls.reason and cls.reason == cls.reason.lower() and " " not in cls.reason
    assert isinstance(cls.retry, bool)


def test_the_consequences_are_the_ones_a_caller_acts_on() -> None:
    retry = {c.__name__ for c in CLASSES if c.retry}
    assert {"KubeError", "LockHeld", "MpsError", "SliceInUse", "SocketError",
            "DeadlineExceeded", "Stopping"} <= retry  # fmt: skip
    assert not {"ConfigError", "SimError", "GeometryInvalid", "NvmlError", "LockError"} & retry


def test_our_own_sockets_locks_and_deadlines_are_not_kubernetes_errors() -> None:
    for cls in (errors.SocketError, errors.LockError, errors.DeadlineExceeded, errors.Stopping):
        assert not issubclass(cls, errors.KubeError)


def test_the_dra_refusals_count_by_the_errors_reason() -> None:
    assert reason_of(errors.SliceInUse("x")) == "in-use"
    assert reason_of(errors.ConfigError("x")) == "bad-input"
    assert reason_of(errors.DeadlineExceeded("x")) == "deadline"
    assert reason_of(ValueError("a bug")) == "other"


def test_a_failed_json_command_prints_its_reason(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    state = tmp_path / "node.json"
    res = cli("--simulate", "h200", "--sim-state", str(state), "mig", "apply",
              "-f", str(tmp_path / "none.yaml"), "-c", "x", "--output", "json")  # fmt: skip
    assert res.returncode == 2
    assert json.loads(res.stdout) == {
        "error": f"cannot read MIG config file {tmp_path / 'none.yaml'}: No such file or directory",
        "reason": "bad-input",
        "retry": False,
    }
