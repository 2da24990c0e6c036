"""An agent over an emulated node with a known layout and load, for the metrics tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import SteppedClock, make_agent
from tests.support.mig_apply import reconfigure
from tests.support.wait import wait_for as wait

GIB = 1024**3


def prometheus_tool(name: str) -> str:
    """`prometheus` or `promtool` (Debian package prometheus): where CI requires them
    (NODEAGENT_REQUIRE_PROMETHEUS) a missing one fails the test, elsewhere it skips."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("NODEAGENT_REQUIRE_PROMETHEUS"):
            pytest.fail(
                f"{name} is not installed (Debian package prometheus); make test installs it"
            )
        pytest.skip(f"{name} not installed (Debian package prometheus)")
    return found


@contextlib.contextmanager
def prometheus_server(binary: str, folder: Path, config: str) -> Iterator[str]:
    """A real Prometheus (`binary`, from prometheus_tool) on a free port of 127.0.0.1, reading
    `config` (its prometheus.yml, written to `folder`) and storing in `folder`/data, its log
    in `folder`/prometheus.log: yields its URL (not yet ready: a test waits for what it needs).
    Terminated at the end; killed when it has not gone within 20 s."""
    path = folder / "prometheus.yml"
    path.write_text(config)
    port = free_port()
    with (folder / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """Status and body, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll `predicate` (OSError counts as not yet) until it is truthy; its value."""
    return wait(predicate, what, timeout, ignore=(OSError,))


def build_agent(
    spec: str, config: str | None, loads: list[tuple[int, str, float]]
) -> tuple[Agent, SimulatedNvml]:
    """An Agent on `spec` after applying generated config `config` (None: MIG stays off), with
    one process per (gpu, profile, load): attached to the first slice of that profile, or to
    the GPU when profile is ''."""
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "generated")
        reconfigure(session, cfg, config, lib.reset)
    inv = read_inventory(session)
    for n, (gpu, profile, load) in enumerate(loads):
        if profile:
            device = next(s.mig_uuid for s in inv.gpus[gpu].slices if s.profile == profile)
        else:
            device = str(gpu)
        lib.attach(device or "", 500 + n, (n + 1) * GIB, load)
    agent = make_agent(session, lib.reset, monotonic=SteppedClock())
    sample(agent)
    return agent, lib


def sample(agent: Agent) -> None:
    """Refresh the inventory and take two GPM samples 100+ ms apart on the agent's clock (a
    SteppedClock: make_agent(..., monotonic=SteppedClock()))."""
    clock = agent.monotonic
    assert isinstance(clock, SteppedClock), "sample() steps the agent's SteppedClock"
    agent.refresh()
    agent.gpm.tick()
    clock.offset += 0.12
    agent.gpm.tick()
