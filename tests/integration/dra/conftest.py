"""A node running the DRA kubelet plugin on the emulator, a kmock API server holding its
ResourceSlices and ResourceClaims, and a fake kubelet that registers the plugin and calls it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.server import KubeletPluginServer, Sockets
from nodeagent.dra.users import PodUsers
from nodeagent.kube.api import KubeSettings, make_api_client
from nodeagent.metrics.dra import DraStats
from nodeagent.nvml import NvmlSession
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from nodeagent.state.snapshot import Holder
from tests.support.dra import DRIVER, NODE, DraNode, dra_cluster, no_reset, node_config, quit_mps
from tests.support.fake_kubelet.dra import FakeDraKubelet

kmock = pytest.importorskip("kmock")


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A short directory: unix socket paths (and MPS pipe directories) are at most 107 bytes."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dra_node(
    request: pytest.FixtureRequest, short_root: Path, fake_mps_control: str
) -> Iterator[DraNode]:
    """An emulated h200x2 node (or the spec a test passes: `indirect` parametrization)."""
    cluster = dra_cluster()
    state = short_root / "sim.json"
    lib = SimulatedNvml(parse_spec(getattr(request, "param", "h200x2")), state)
    session = NvmlSession(lib)
    kube = KubeSettings(node_name=NODE, host=cluster.url, retry_seconds=1.0)
    api = DraApi(make_api_client(kube), kube)
    lock = state.with_name(".sim.json.lock")
    pods: dict[str, Holder] = {}
    config = node_config(short_root, fake_mps_control)
    stats = DraStats()
    node = dra_driver(
        session, Settings(), config, no_reset, lock, pods=lambda: dict(pods), stats=stats,
        users=PodUsers(api),
    )  # fmt: skip
    sockets = Sockets(short_root / "p" / "dra.sock", short_root / "reg" / f"{DRIVER}-reg.sock")
    server = KubeletPluginServer(node, api, DRIVER, sockets)
    server.start()
    kubelet = FakeDraKubelet(short_root / "reg")
    kubelet.register(DRIVER)
    try:
        yield DraNode(cluster, lib, session, node, server, kubelet, short_root, state, pods, stats)
    finally:
        server.stop()
        for daemon_dir in (short_root / "p" / "mps").glob("*/*"):
            quit_mps(fake_mps_control, daemon_dir)
        for daemon_dir in (short_root / "p" / "mps-shared").glob("*"):
            quit_mps(fake_mps_control, daemon_dir)
        session.close()
        cluster.close()
