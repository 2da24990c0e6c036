"""Two share claims of one MIG slice, the driver killed at every file write and at each of the
first NVML mutations of one of their calls, then started again (its share watch's first look
included) and the kubelet's calls going on: while a share is prepared the slice is the one the
first share made (never made again) and its server runs; once none holds it the slice is gone;
at the end nothing is left (record, slice, server, CDI spec). The kill points are
tests.support.crash's, as the whole-slice sweeps of test_crash.py use them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.factory import dra_driver
from nodeagent.dra.claims import ClaimRef
from nodeagent.dra.node import NodeDriver
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from nodeagent.state.held import PREPARED
from tests.integration.dra.test_share_servers import capped, share
from tests.support.crash import run
from tests.support.dra import no_reset, node_config, quit_mps

SPEC = "h200x4"
DEVICE = "gpu-0-mig-1g18gb-19-2-mps"
Call = tuple[str, dict[str, Any]]  # (prepare | unprepare, the claim)


def _claim(uid: str, sm: int) -> dict[str, Any]:
    return capped(share(f"c-{uid}", uid, DEVICE, sm, f"{sm // 10}Gi"), smLimit=sm)


A, B = _claim("uid-a", 50), _claim("uid-b", 20)

# flow: (the calls made first, the call killed, the calls after the restart)
FLOWS: dict[str, tuple[list[Call], Call, list[Call]]] = {
    "first-leaves-then-the-other": (
        [("prepare", A), ("prepare", B)], ("unprepare", A), [("unprepare", A), ("unprepare", B)]
    ),
    "first-leaves-after-the-other": (
        [("prepare", A), ("prepare", B)], ("unprepare", A), [("unprepare", B), ("unprepare", A)]
    ),
    "last-leaves": ([("prepare", A), ("prepare", B), ("unprepare", A)], ("unprepare", B),
                    [("unprepare", B)]),
    "join-asked-again": ([("prepare", A)], ("prepare", B),
                         [("prepare", B), ("unprepare", A), ("unprepare", B)]),
    "join-given-up": ([("prepare", A)], ("prepare", B), [("unprepare", B), ("unprepare", A)]),
    "maker-asked-again": ([], ("prepare", A),
                          [("prepare", A), ("prepare", B), ("unprepare", A), ("unprepare", B)]),
    "maker-given-up": ([], ("prepare", A), [("unprepare", A)]),
}  # fmt: skip


def _driver(root: Path, control: str) -> NodeDriver:
    lib = SimulatedNvml(parse_spec(SPEC), root / "sim.json")
    config = node_config(root, control)
    return dra_driver(NvmlSession(lib), Settings(), config, no_reset, root / ".sim.json.lock")


def _slices(root: Path) -> list[str | None]:
    session = NvmlSession(SimulatedNvml(parse_spec(SPEC), root / "sim.json"))
    try:
        return [s.mig_uuid for s in read_inventory(session).gpus[0].slices]
    finally:
        session.close()


def _servers(root: Path) -> list[Path]:
    return sorted(p for p in (root / "p" / "mps-shared").glob("*") if p.is_dir())


def _do(node: NodeDriver, call: Call) -> None:
    action, claim = call
    meta = claim["metadata"]
    if action == "prepare":
        node.prepare(ClaimRef(meta["namespace"], meta["name"], meta["uid"]), claim)
    else:
        node.unprepare(meta["uid"])


def _one(root: Path, control: str, flow: str, fault: Any, kill: Any) -> int:
    """One kill point of `flow`; the process's exit code (0: the call was not killed)."""
    root.mkdir()
    lib = SimulatedNvml(parse_spec(SPEC), root / "sim.json")
    MigWriter(NvmlSession(lib)).set_mig_mode(0, True)
    first, (action, claim), then = FLOWS[flow]
    node = _driver(root, control)
    try:
        for call in first:
            _do(node, call)
        made = _slices(root)
        code = run(root, action, claim, fault, kill, "node-1", SPEC, control)
        node = _driver(root, control)  # started again
        node.check_shares()  # the share watch's first look
        for call in then:
            _do(node, call)
            node.check_shares()
            recorded = node.owners.read().claims
            now = _slices(root)
            if any(c.state == PREPARED for c in recorded.values()):
                assert len(now) == 1, (call[0], recorded)
                assert not made or now == made, "the slice was made again while a share held it"
                assert _servers(root), "a prepared share has no server"
            if not any(c.devices for c in recorded.values()):
                assert now == [], "the slice outlived every claim holding it"
        assert node.owners.read().claims == {}
        assert _slices(root) == [] and _servers(root) == []
        assert not (root / "cdi").exists() or not list((root / "cdi").glob("*"))
        assert node.check_shares() == []
        return code
    finally:
        for server in _servers(root):
            quit_mps(control, server)


@pytest.mark.parametrize("flow", list(FLOWS))
def test_shares_killed_at_every_write_converge(
    short_root: Path, fake_mps_control: str, flow: str
) -> None:
    codes = []
    for n in itertools.count(1):
        codes.append(_one(short_root / f"w{n}", fake_mps_control, flow, None, {"write": n}))
        if codes[-1] == 0:
            break
    assert len(codes) >= 2  # killed at least once: the sweep swept


@pytest.mark.parametrize("flow", list(FLOWS))
def test_shares_killed_at_the_first_mutations_converge(
    short_root: Path, fake_mps_control: str, flow: str
) -> None:
    for n, when in itertools.product(range(1, 5), ("before", "after")):
        fault = {"mutation": n, "exit": 137, "when": when}
        _one(short_root / f"m{n}{when}", fake_mps_control, flow, fault, None)
