"""`nodeagent run --kube --dra` as a whole: the agent publishes the node's ResourceSlices,
serves the kubelet, and a slice a claim holds is busy for the mig.config protocol (the
device-plugin path's reconcile never destroys it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.agent.service import Agent
from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.integration.dra.test_publish import slices
from tests.support.agent import make_agent
from tests.support.cluster import Cluster, kube_group
from tests.support.dra import CLAIMS, DRIVER, NODE, allocated_claim, dra_cluster, dra_group
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet

STATE = "nvidia.com/mig.config.state"
REASON = "nodeagent.io/mig.config.reason"


def _agent(
    short_root: Path, cluster: Cluster, lib: SimulatedNvml, session: NvmlSession, dra: bool
) -> Agent:
    mig = short_root / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    return make_agent(
        session,
        lib.reset,
        metrics={"refresh_interval_seconds": 0.2},
        reconcile={"interval_seconds": 300},
        mig={"config_file": str(mig)},
        kube=kube_group(cluster, NODE),
        dra=dra_group(short_root, enabled=dra),
    )


@pytest.fixture
def agent(short_root: Path) -> Iterator[tuple[Agent, Cluster, SimulatedNvml]]:
    cluster = dra_cluster()
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    lib = SimulatedNvml(parse_spec("h200x2"))
    agent = _agent(short_root, cluster, lib, NvmlSession(lib), dra=True)
    agent.start()
    try:
        yield agent, cluster, lib
    finally:
        agent.stop()
        cluster.close()


def _prepared(
    cluster: Cluster, root: Path, name: str, uid: str, device: str
) -> tuple[FakeDraKubelet, Claim]:
    """Claim speech/`name` allocated `device` and prepared by a fake kubelet."""
    kubelet = FakeDraKubelet(root / "reg")
    kubelet.register(DRIVER)
    cluster.km.objects[CLAIMS, "speech", name] = allocated_claim(name, uid, {"gpu": device})
    ref = Claim("speech", name, uid)
    assert kubelet.prepare([ref])[uid].error == ""
    return kubelet, ref


def _refused_for_the_claim(cluster: Cluster, session: NvmlSession) -> None:
    """A mig.config that would destroy claim speech/asr's 3g.71gb at 4 fails, naming it."""
    cluster.label(NODE, {"nvidia.com/mig.config": "all-1g.18gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="state failed")
    assert "claim speech/asr" in cluster.annotations(NODE)[REASON]
    with session.lock:
        gpu0 = read_inventory(session).gpus[0]
    assert [(s.profile, s.placement.start) for s in gpu0.slices] == [("3g.71gb", 4)]


def test_a_claimed_slice_is_busy_for_the_mig_config_protocol(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    running, cluster, _ = agent
    cluster.wait(lambda: len(slices(cluster)) == 3, what="the node's 3 ResourceSlices")
    kubelet = FakeDraKubelet(short_root / "reg")
    assert kubelet.register(DRIVER) == "v1.DRAPlugin"
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-3g71gb-9-4"})
    cluster.km.objects[CLAIMS, "speech", "asr"] = claim
    ref = Claim("speech", "asr", "uid-1")
    assert kubelet.prepare([ref])["uid-1"].error == ""

    _refused_for_the_claim(cluster, running.session)

    assert kubelet.unprepare([ref]) == {"uid-1": ""}
    cluster.label(NODE, {"nvidia.com/mig.config": "all-3g.71gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="state success")


def test_claims_stay_held_when_dra_is_turned_off(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    """The agent restarted without --dra: the pods of the claims it prepared still run."""
    running, cluster, lib = agent
    _prepared(cluster, short_root, "asr", "uid-1", "gpu-0-mig-3g71gb-9-4")
    running.stop()
    without = _agent(short_root, cluster, lib, running.session, dra=False)
    without.start()
    try:
        _refused_for_the_claim(cluster, running.session)
    finally:
        without.stop()


def test_a_whole_gpu_claim_keeps_its_gpu_out_of_mig(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    """An MPS share or a whole GPU: MIG turned on under it would take the GPU from its pods."""
    running, cluster, _ = agent
    kubelet, ref = _prepared(cluster, short_root, "big", "uid-w", "gpu-1")

    cluster.label(NODE, {"nvidia.com/mig.config": "all-1g.18gb"})

    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "failed", what="state failed")
    reason = cluster.annotations(NODE)[REASON]
    assert "cannot enable MIG on GPU 1: the whole GPU is in use by claim speech/big" in reason
    with running.session.lock:
        assert not read_inventory(running.session).gpus[1].mig_current
    assert kubelet.unprepare([ref]) == {"uid-w": ""}
    cluster.label(NODE, {"nvidia.com/mig.config": "all-3g.71gb"})
    cluster.wait(lambda: cluster.labels(NODE).get(STATE) == "success", what="state success")


def test_an_unreadable_checkpoint_makes_readyz_say_why(
    agent: tuple[Agent, Cluster, SimulatedNvml], short_root: Path
) -> None:
    running, _cluster, _ = agent
    running.reconcile()
    assert running.ready() == (True, "ok")
    checkpoint = short_root / "p" / "checkpoint.json"
    checkpoint.write_text("{half")
    ready, reason = running.ready()
    assert not ready
    assert reason.startswith(f"DRA: DRA checkpoint {checkpoint} is not JSON")
    assert "If the DRA checkpoint is unreadable" in reason
    # Moved aside (the documented recovery), the agent is ready again by itself.
    checkpoint.rename(checkpoint.with_suffix(".bad"))
    assert running.ready() == (True, "ok")


def test_dra_devices_naming_a_gpu_the_node_lacks_is_refused(short_root: Path) -> None:
    from nodeagent.base.errors import ConfigError

    cluster = dra_cluster()
    cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
    lib = SimulatedNvml(parse_spec("h200x2"))
    try:
        agent = make_agent(
            NvmlSession(lib),
            lib.reset,
            kube={"enabled": True, "node_name": NODE, "host": cluster.url, "pod_resources_socket": None},
            dra=dra_group(short_root, devices=(1, 5)),
        )  # fmt: skip
        with pytest.raises(ConfigError, match=r"names GPU 5; this node has GPUs \[0, 1\]"):
            agent.start()
        agent.stop()
        assert not (short_root / "p" / "dra.sock").exists()
    finally:
        cluster.close()
