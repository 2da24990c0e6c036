"""The MIG reset command (nodeagent.mig.apply.command_reset) runs in its own session: one that
outlives its timeout is killed with its process group, so a child it started (a reset helper
left behind) does not survive it, and the mode change waits for a reboot."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from nodeagent.base.errors import ModeChangePending
from nodeagent.mig.apply import command_reset
from tests.support.host import gone_within, leaving_a_child


def test_a_reset_command_past_its_timeout_leaves_no_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    reset = command_reset(leaving_a_child(pidfile) + " {index}", timeout_seconds=1)
    began = time.monotonic()
    with pytest.raises(ModeChangePending) as err:
        reset(3)
    assert str(err.value).startswith("GPU 3: MIG mode change is pending and the reset command")
    assert str(err.value).endswith(" did not finish within 1 s (it was ended with its children)")
    assert time.monotonic() - began < 10  # not held by the child's end of the pipe
    assert gone_within(int(pidfile.read_text()), 5)


def test_a_failing_reset_command_names_its_last_line() -> None:
    reset = command_reset(f"{sys.executable} -c \"import sys; sys.exit('no reset for {{index}}')\"")
    with pytest.raises(ModeChangePending, match=r"GPU 1: .* failed \(exit 1\): no reset for 1"):
        reset(1)


def test_a_reset_command_that_cannot_start_is_said_in_the_systems_words(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-reset"
    with pytest.raises(ModeChangePending) as err:
        command_reset(f"{missing} {{index}}")(0)
    assert str(err.value) == (
        f"GPU 0: MIG mode change is pending and the reset command {str(missing)!r} could not"
        " start: No such file or directory"
    )
    assert "Errno" not in str(err.value)
