"""A prepare or unprepare killed at every NVML mutation (the emulator's fault injection:
NODEAGENT_SIM_FAULTS [{"mutation": N, "exit": 137}], state kept in a file as the GPUs keep
theirs) converges when the kubelet asks again: the same slices, the claim prepared once, and
after unprepare nothing of the claim left.

A claim killed at any file write of its prepare, make or unprepare (the driver process ends
just before the Nth rename of a written file: the checkpoint, the ownership record, the CDI
spec, the emulator's state, that is after each NVML mutation too) and then deleted leaves
nothing once the restarted driver unprepared it: no CDI spec, nor a write of one cut short,
no MIG slice, no checkpoint or ownership entry."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.base.files import interrupted_writes
from nodeagent.dra.checkpoint import PREPARED, load
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.crash import run
from tests.support.dra import allocated_claim, no_reset, node_config

# (name, claimed device, the GPU before: MIG on?, slices there (profile id, start, size),
#  NVML mutations the prepare makes)
SCENARIOS = [
    ("mig-off", "gpu-0-mig-1g18gb-19-2", False, [], 3),  # mode, GI, CI
    ("idle-slice-in-the-way", "gpu-0-mig-2g35gb-14-2", True, [(9, 0, 4)], 4),  # CI, GI, GI, CI
]


def setup_gpu(root: Path, mig: bool, slices: list[tuple[int, int, int]]) -> SimulatedNvml:
    lib = SimulatedNvml(parse_spec("h200x2"), root / "sim.json")
    session = NvmlSession(lib)
    writer = MigWriter(session)
    if mig:
        writer.set_mig_mode(0, True)
    for profile_id, start, size in slices:
        gi = writer.create_gpu_instance(0, profile_id, Placement(start, size))
        writer.create_compute_instance(0, gi, 3, 0, full=True)
    return lib


def layout(root: Path) -> tuple[bool, list[tuple[str, int, bool]]]:
    """GPU 0's MIG mode and slices (profile, start, has its CI), read afresh from the file."""
    session = NvmlSession(SimulatedNvml(parse_spec("h200x2"), root / "sim.json"))
    gpu = read_inventory(session).gpus[0]
    session.close()
    return gpu.mig_current, sorted(
        (s.profile, s.placement.start, s.ci_id is not None) for s in gpu.slices
    )


def driver(root: Path) -> NodeDriver:
    lib = SimulatedNvml(parse_spec("h200x2"), root / "sim.json")
    return dra_driver(
        NvmlSession(lib), Settings(), node_config(root), no_reset, root / ".sim.json.lock"
    )


CASES = [
    pytest.param(name, device, mig, slices, n, when, id=f"{name}-{when}-mutation-{n}")
    for name, device, mig, slices, count in SCENARIOS
    # before each mutation; after the last (before the checkpoint says prepared); and before
    # a mutation count + 1, which never comes: `count` is all there is
    for n, when in [*((i, "before") for i in range(1, count + 2)), (count, "after")]
]


@pytest.mark.parametrize(("name", "device", "mig", "slices", "n", "when"), CASES)
def test_prepare_killed_at_every_mutation_converges(
    short_root: Path,
    name: str,
    device: str,
    mig: bool,
    slices: list[tuple[int, int, int]],
    n: int,
    when: str,
) -> None:
    setup_gpu(short_root, mig, slices)
    claim = allocated_claim("asr", "uid-1", {"gpu": device})
    ref = ClaimRef("speech", "asr", "uid-1")
    count = next(c for s, _, _, _, c in SCENARIOS if s == name)

    code = run(short_root, "prepare", claim, {"mutation": n, "exit": 137, "when": when})
    assert code == (137 if n <= count else 0)

    (answer,) = driver(short_root).prepare(ref, claim)  # the kubelet asks again
    profile = "1g.18gb" if "1g18gb" in device else "2g.35gb"
    start = int(device.rsplit("-", 1)[1])
    assert layout(short_root) == (True, [(profile, start, True)])
    assert load(short_root / "p" / "checkpoint.json").claims["uid-1"].state == PREPARED
    assert answer.cdi_ids == (f"k8s.gpu.nodeagent.io/claim=uid-1-{device}",)
    assert (short_root / "cdi" / "k8s.gpu.nodeagent.io-claim_uid-1.json").exists()

    driver(short_root).unprepare("uid-1")
    assert layout(short_root) == (True, [])
    assert load(short_root / "p" / "checkpoint.json").claims == {}


@pytest.mark.parametrize(
    ("n", "left"),
    [(1, [("3g.71gb", 4, False)]), (2, [])],  # killed after destroy-ci, -gi
)
def test_unprepare_killed_at_every_mutation_converges(
    short_root: Path, n: int, left: list[tuple[str, int, bool]]
) -> None:
    setup_gpu(short_root, True, [])
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-3g71gb-9-4"})
    driver(short_root).prepare(ClaimRef("speech", "asr", "uid-1"), claim)
    fault = {"mutation": n, "exit": 137, "when": "after"}
    assert run(short_root, "unprepare", claim, fault) == 137
    assert layout(short_root) == (True, left)
    assert "uid-1" in load(short_root / "p" / "checkpoint.json").claims
    driver(short_root).unprepare("uid-1")
    assert layout(short_root) == (True, [])
    assert not (short_root / "cdi" / "k8s.gpu.nodeagent.io-claim_uid-1.json").exists()


def test_a_killed_prepare_the_kubelet_gives_up_on_is_undone(short_root: Path) -> None:
    """The pod was deleted while the plugin was down: the kubelet unprepares instead."""
    setup_gpu(short_root, True, [])
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-4g71gb-5-0"})
    assert run(short_root, "prepare", claim, {"mutation": 2, "exit": 137}) == 137
    assert layout(short_root) == (True, [("4g.71gb", 0, False)])  # a GI without its CI
    driver(short_root).unprepare("uid-1")
    assert layout(short_root) == (True, [])


SPEC = "k8s.gpu.nodeagent.io-claim_uid-1.json"
MIG_DEVICE = "gpu-0-mig-1g18gb-19-2"
NOTHING: dict[str, list[Any]] = {
    "cdi": [], "checkpoint writes": [], "slices": [], "checkpoint": [], "owners": []
}  # fmt: skip


def left_behind(root: Path) -> dict[str, list[Any]]:
    """What a restarted driver finds of the claims: the CDI folder's files (a temporary one
    of a write cut short included), the checkpoint's, GPU 0's slices, the checkpoint's and
    the ownership record's claims."""
    node = driver(root)  # the agent restarted
    cdi_dir = root / "cdi"
    return {
        "cdi": sorted(os.listdir(cdi_dir)) if cdi_dir.exists() else [],
        "checkpoint writes": [p.name for p in interrupted_writes(root / "p" / "checkpoint.json")],
        "slices": layout(root)[1],
        "checkpoint": sorted(load(root / "p" / "checkpoint.json").claims),
        "owners": sorted(node.owners.read().claims),
    }


@pytest.mark.parametrize("asked_again", [False, True], ids=["deleted", "prepared-again-deleted"])
@pytest.mark.parametrize("made_first", [False, True], ids=["prepare-makes", "prepare-adopts"])
def test_a_prepare_killed_writing_its_cdi_spec_leaves_nothing_once_deleted(
    short_root: Path, made_first: bool, asked_again: bool
) -> None:
    """Issue 39 class 7: killed after the CDI spec's temporary file was written (and fsynced),
    before its rename. The spec's name is not there, its temporary file is, and nothing but
    the claim's unprepare can tell that file is the claim's. `made_first`: the slice was made
    before the pod bound (the binding watcher's make, as on the real scheduler)."""
    setup_gpu(short_root, True, [])
    claim = allocated_claim("asr", "uid-1", {"gpu": MIG_DEVICE})
    ref = ClaimRef("speech", "asr", "uid-1")
    if made_first:
        driver(short_root).make(ref, claim)
    spec = short_root / "cdi" / SPEC

    assert run(short_root, "prepare", claim, None, {"at": str(spec)}) == 137
    assert not spec.exists()
    assert len(interrupted_writes(spec)) == 1  # the window: a spec left that nothing names

    node = driver(short_root)  # the agent restarted
    if asked_again:  # the kubelet asks again before the pod goes
        (answer,) = node.prepare(ref, claim)
        assert answer.cdi_ids == (f"k8s.gpu.nodeagent.io/claim=uid-1-{MIG_DEVICE}",)
        assert json.loads(spec.read_text())["devices"][0]["name"] == f"uid-1-{MIG_DEVICE}"
    node.unprepare("uid-1")  # the pod and its claim deleted: the kubelet unprepares
    assert left_behind(short_root) == NOTHING


FLOWS = {  # the calls that completed before, the call killed
    "prepare": ((), "prepare"),
    "make": ((), "make"),
    "prepare-after-make": (("make",), "prepare"),
    "unprepare": (("prepare",), "unprepare"),
}


@pytest.mark.parametrize("flow", FLOWS)
def test_a_claim_killed_at_any_write_and_deleted_leaves_nothing(
    short_root: Path, flow: str
) -> None:
    """Killed before each rename of a written file in turn (then once more: the call
    completes); after each, the restarted driver unprepares the deleted claim and nothing of
    it is left."""
    done, killed = FLOWS[flow]
    claim = allocated_claim("asr", "uid-1", {"gpu": MIG_DEVICE})
    ref = ClaimRef("speech", "asr", "uid-1")
    points = []
    for n in itertools.count(1):
        root = short_root / str(n)
        root.mkdir()
        setup_gpu(root, True, [])
        for call in done:
            getattr(driver(root), call)(ref, claim)
        code = run(root, killed, claim, None, {"write": n})
        if code == 137:
            points.append((root / "killed-at").read_text().removeprefix(f"{root}/"))
        driver(root).unprepare("uid-1")  # restarted; the pod and its claim deleted
        assert left_behind(root) == NOTHING, f"killed before write {n}: {points[-1:]}"
        if code == 0:  # every write of the call was a kill point
            break
    assert len(points) >= 4
    assert (f"cdi/{SPEC}" in points) == (killed == "prepare")
