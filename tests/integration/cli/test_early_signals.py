"""A stop signal in a command's first milliseconds, while `python -m nodeagent` still imports
nodeagent.cli: noted by the handler its __main__ takes first, then acted on as one that came
while the command parsed its flags (the documented exit code, nothing printed), never Python's
KeyboardInterrupt traceback or a death by the signal's default action.

The signal is sent from inside the process at that moment, by a finder that sees the import of
nodeagent.cli begin (a sitecustomize on PYTHONPATH): the same moment every run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO

SITECUSTOMIZE = """
import importlib.abc, os, signal, sys

class Kill(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nodeagent.cli":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{signal})
        return None

sys.meta_path.insert(0, Kill())
"""


@pytest.mark.parametrize(
    "signum, args, code",
    [
        (signal.SIGINT, ["status"], 130),
        (signal.SIGTERM, ["status"], 143),
        (signal.SIGINT, ["mig", "export"], 130),
        (signal.SIGTERM, ["run", "--metrics-address", "127.0.0.1:0"], 0),  # run: a stop ends it
    ],
)
def test_a_signal_while_nodeagent_cli_imports(
    tmp_path: Path, signum: signal.Signals, args: list[str], code: int
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE.format(signal=signum.name))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    state = ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]
    proc = subprocess.run(
        [sys.executable, "-m", "nodeagent", *state, *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, "", "")
    assert not (tmp_path / "node.json").exists()  # the command never ran
