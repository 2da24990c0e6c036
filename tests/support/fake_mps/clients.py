"""The fake MPS daemon and its fake CUDA clients, driven from a test (or a benchmark's dry run).

`FakeMpsDaemon(control, root)` is one control daemon with its pipe and log directories under
`root` (the control program is the `fake_mps_control` fixture's); `FakeMpsClient(env)` is one
client process (fake-mps-client) started with `env` as its whole environment, as a container
started from a CDI spec would be: `answer()` is what it got from the daemon (the server's pid,
its user and the limits it really has), `waiting()` says it has no answer yet (a client of
another user behind the server), `stop()` ends it as a pod's end does.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.wait import wait_for

CLIENT = Path(__file__).resolve().with_name("fake-mps-client")


class FakeMpsDaemon:
    def __init__(self, control: str, root: Path) -> None:
        self.control = control
        self.pipe_dir = root / "pipe"
        self.log_dir = root / "log"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            **extra,
        }

    def start(self, **extra: str) -> None:
        """`nvidia-cuda-mps-control -d` with `extra` in its environment (FAKE_MPS_* controls)."""
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [self.control, "-d"], env=self.env(**extra), capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def command(self, line: str) -> str:
        """One command through the control program; its answer, stripped."""
        done = subprocess.run(
            [self.control], input=line + "\n", env=self.env(), capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        return done.stdout.strip()

    def pid(self) -> int:
        return int((self.pipe_dir / "nvidia-cuda-mps-control.pid").read_text())

    def servers(self) -> list[int]:
        return [int(x) for x in self.command("get_server_list").split()]

    def clients(self, server: int) -> list[int]:
        return [int(x) for x in self.command(f"get_client_list {server}").split()]

    def log(self) -> str:
        path = self.log_dir / "control.log"
        return path.read_text() if path.exists() else ""

    def wait_log(self, text: str, timeout: float = 10) -> None:
        wait_for(lambda: text in self.log(), f"{text!r} in control.log", timeout)

    def quit(self) -> None:
        """`quit`, and wait until the daemon has gone (its control socket removed)."""
        if (self.pipe_dir / "control").exists():
            self.command("quit")
            wait_for(lambda: not (self.pipe_dir / "control").exists(), "the daemon gone", 10)


class FakeMpsClient:
    """One fake CUDA client. `uid` connects as that user; `ask` rewrites its own environment
    before it connects (a program asking for more than its container was given)."""

    def __init__(
        self,
        env: Mapping[str, str],
        uid: int | None = None,
        ask: Mapping[str, str] | None = None,
    ) -> None:
        argv = [sys.executable, "-IS", str(CLIENT)]
        if uid is not None:
            argv += ["--uid", str(uid)]
        for name, value in (ask or {}).items():
            argv += ["--set", f"{name}={value}"]
        self.proc = subprocess.Popen(
            argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._answer: dict[str, Any] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def waiting(self) -> bool:
        """No answer yet, and still running."""
        assert self.proc.stdout is not None
        if self._answer is not None:
            return False
        ready, _, _ = select.select([self.proc.stdout], [], [], 0)
        return not ready and self.proc.poll() is None

    def answer(self, timeout: float = 10) -> dict[str, Any]:
        """What the daemon answered: server, user, active_thread_percentage (text, as the
        daemon prints it), pinned_device_mem_limit ({device: '4G'}), pid."""
        assert self.proc.stdout is not None
        if self._answer is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            assert ready, f"client {self.pid} got no answer in {timeout:g} s"
            line = self.proc.stdout.readline()
            assert line, f"client {self.pid} exited: {self.stderr()}"
            self._answer = dict(json.loads(line))
        return self._answer

    def wait(self, timeout: float = 10) -> int:
        """Its exit code once it ends by itself (1: it lost its server)."""
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()

    def stop(self) -> int:
        """SIGTERM, as a pod's end; a client still there after 10 s (a loaded machine: CI saw
        one) is killed, so a test's teardown never fails on its clean-up."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code
