"""A host command that outlives mig.hook-timeout is killed with its process group: a child it
started (a `sleep` left behind) does not survive it (issue 39, class 6)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeagent.host.duties import HostDutyError, run_command
from tests.support.host import gone_within, leaving_a_child


def test_the_timeout_kills_the_command_and_the_child_it_left(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    began = time.monotonic()
    with pytest.raises(HostDutyError, match="did not finish within 1 s"):
        run_command(leaving_a_child(pidfile), "the CDI refresh command", 1)
    assert time.monotonic() - began < 10  # not held by the child's end of the pipe
    assert gone_within(int(pidfile.read_text()), 5)
