"""`reconfigure` through the real nvml/ code on the emulator: every generated config to every
other, in-use slices, Ampere resets, and a failure or kill at every mutation."""

from __future__ import annotations

import contextlib
from itertools import product
from pathlib import Path

import pytest

from nodeagent.base.errors import (
    ConfigError,
    ModeChangePending,
    NothingMatched,
    NvmlError,
    SliceInUse,
)
from nodeagent.mig.config import MigConfigFile, dump_config, parse_config
from nodeagent.mig.generate import export_current, generate_configs
from nodeagent.mig.plan import Op, mismatches
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml
from nodeagent.sim.faults import SimulatedCrash
from nodeagent.sim.models import MIB, parse_spec
from tests.support.mig_apply import reconfigure

MODELS = ["a100-40gb", "h100-80gb", "h200", "a30"]


def _node(
    spec: str, state: Path | None = None, faults: list[Fault] | None = None
) -> tuple[SimulatedNvml, NvmlSession]:
    lib = SimulatedNvml(parse_spec(spec), state, FaultPlan(faults or [], in_process=True))
    return lib, NvmlSession(lib)


def _generated(session: NvmlSession):  # type: ignore[no-untyped-def]
    return parse_config(dump_config(generate_configs(read_inventory(session))), "generated.yaml")


def _baseline(before: object, target_counts: int, mode_ops: int) -> int:
    """mig-parted's way: destroy every slice (CI + GI) and create every wanted one."""
    return 2 * len(before.slices) + 2 * target_counts + mode_ops  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", MODELS)
def test_every_generated_config_to_every_other(model: str) -> None:
    lib, session = _node(model)
    cfg = _generated(session)
    names = sorted(cfg.configs)
    total_plan = total_base = 0
    for a, b in product(names, names):
        lib.reset(0)
        lib.state.gpus[0].mig_current = lib.state.gpus[0].mig_pending = 0
        reconfigure(session, cfg, a, lib.reset)
        before = read_inventory(session).gpus[0]
        outcome = reconfigure(session, cfg, b, lib.reset)
        assert mismatches(outcome.inventory, outcome.desired) == [], (a, b)
        want = sum(outcome.desired[0].counts.values())
        mode_ops = int(cfg.configs[a][0].mig_enabled != cfg.configs[b][0].mig_enabled)
        base = _baseline(before, want, mode_ops)
        assert len(outcome.done) <= base, (a, b)
        total_plan += len(outcome.done)
        total_base += base
        again = reconfigure(session, cfg, b, lib.reset)
        assert again.done == (), (a, b)  # idempotent
    assert total_plan < total_base


def _mig_uuid(session: NvmlSession, gpu: int, profile: str) -> str:
    slices = read_inventory(session).gpus[gpu].slices
    uuid = [s.mig_uuid for s in slices if s.profile == profile][-1]  # the last one placed
    assert uuid
    return uuid


def test_in_use_slice_survives_every_transition() -> None:
    lib, session = _node("h200")
    cfg = _generated(session)
    reconfigure(session, cfg, "all-balanced", lib.reset)
    busy = _mig_uuid(session, 0, "1g.18gb")
    lib.attach(busy, 4242, 512 * MIB)
    for name in sorted(cfg.configs):
        before = lib.state.gpus[0].gis.copy()
        try:
            reconfigure(session, cfg, name, lib.reset)
        except SliceInUse as err:
            assert busy in str(err) and "pid 4242" in str(err)
            assert lib.state.gpus[0].gis.keys() == before.keys()  # nothing changed
        uuids = {s.mig_uuid for s in read_inventory(session).gpus[0].slices}
        assert busy in uuids, name


def test_ampere_resets_only_the_gpu_that_changes() -> None:
    lib, session = _node("a100-40gbx2")
    resets: list[int] = []

    def reset(index: int) -> None:
        resets.append(index)
        lib.reset(index)

    cfg = parse_config(
        "version: v1\nmig-configs:\n  one:\n    - devices: [1]\n      mig-enabled: true\n"
        "      mig-devices: {3g.20gb: 2}\n",
        "one.yaml",
    )
    outcome = reconfigure(session, cfg, "one", reset)
    assert resets == [1]
    first = outcome.done[0]
    assert (first.op.op, first.op.gpu, first.op.enabled) == (Op.SET_MIG_MODE, 1, True)
    assert first.reset and first.seconds >= 0
    assert first.to_dict() == {"op": "set-mig-mode", "gpu": 1, "enabled": True, "reset": True}
    inv = read_inventory(session)
    assert not inv.gpus[0].mig_current and len(inv.gpus[1].slices) == 2


def test_pending_mode_that_does_not_clear_is_reported() -> None:
    _lib, session = _node("a100-40gb")
    cfg = _generated(session)
    with pytest.raises(ModeChangePending, match="still disabled"):
        reconfigure(session, cfg, "all-enabled", lambda index: None)


def test_hopper_with_processes_stays_pending() -> None:
    lib, session = _node("h200")
    lib.attach("0", 7, 10 * MIB)
    with pytest.raises(ModeChangePending, match="processes are using the GPU"):
        reconfigure(session, _generated(session), "all-balanced", lib.reset)


def test_unknown_name_and_nothing_matched() -> None:
    lib, session = _node("h200")
    with pytest.raises(ConfigError, match=r"no config named 'nope'.*all-balanced"):
        reconfigure(session, _generated(session), "nope", lib.reset)
    other = parse_config(
        "version: v1\nmig-configs:\n  a100:\n    - devices: all\n      device-filter: '0x20B010DE'\n"
        "      mig-enabled: true\n      mig-devices: {1g.5gb: 7}\n",
        "a100.yaml",
    )
    with pytest.raises(NothingMatched, match="matches no GPU"):
        reconfigure(session, other, "a100", lib.reset)


def test_export_is_accepted_by_apply_and_changes_nothing() -> None:
    lib, session = _node("h200x2")
    cfg = _generated(session)
    reconfigure(session, cfg, "all-balanced", lib.reset)
    current = parse_config(dump_config(export_current(read_inventory(session))), "current.yaml")
    assert reconfigure(session, current, "current", lib.reset).done == ()


TRANSITIONS = [
    ("h200", "all-disabled", "all-balanced", None),
    ("h200", "all-balanced", "all-1g.18gb", "1g.18gb"),
    ("h200", "all-1g.18gb", "all-3g.71gb", None),
    ("h200", "all-3g.71gb", "all-balanced", "3g.71gb"),
    ("a100-40gb", "all-1g.5gb", "all-disabled", None),
    ("a100-40gb", "all-disabled", "all-2g.10gb", None),
    ("a30", "all-balanced", "all-1g.6gb", "1g.6gb"),
]


def _first(
    model: str, first: str, busy: str | None, tmp_path: Path
) -> tuple[MigConfigFile, bytes, str | None]:
    """A `model` node after config `first`, with a process on the last `busy` slice: the
    generated configs, the state file's bytes and the busy slice's UUID."""
    state = tmp_path / "first.json"
    lib, session = _node(model, state)
    cfg = _generated(session)
    reconfigure(session, cfg, first, lib.reset)
    busy_uuid = _mig_uuid(session, 0, busy) if busy else None
    if busy_uuid:
        lib.attach(busy_uuid, 99, MIB)
    return cfg, state.read_bytes(), busy_uuid


def _mutations(model: str, cfg: MigConfigFile, second: str, state: Path) -> int:
    lib, session = _node(model, state)
    with contextlib.suppress(SliceInUse):
        reconfigure(session, cfg, second, lib.reset)
    return lib.faults.mutations


@pytest.mark.parametrize(("model", "first", "second", "busy"), TRANSITIONS)
@pytest.mark.parametrize("mode", ["error", "kill-before", "kill-after"])
def test_failure_at_every_mutation_converges(
    tmp_path: Path, model: str, first: str, second: str, busy: str | None, mode: str
) -> None:
    # Every run starts from a copy of one node after `first` (replaying it per run took most
    # of this test's time and gave the same state file).
    cfg, start, busy_uuid = _first(model, first, busy, tmp_path)
    (tmp_path / "count.json").write_bytes(start)
    steps = _mutations(model, cfg, second, tmp_path / "count.json")
    assert steps > 0
    for k in range(1, steps + 1):
        state = tmp_path / f"node-{k}.json"
        state.write_bytes(start)
        lib, session = _node(model, state)
        fault = (
            Fault(mutation=lib.faults.mutations + k, error=999)
            if mode == "error"
            else Fault(mutation=lib.faults.mutations + k, exit_code=137, when=mode.split("-")[1])
        )
        lib.faults.faults.append(fault)
        with pytest.raises((NvmlError, SimulatedCrash, SliceInUse)):
            reconfigure(session, cfg, second, lib.reset)
        # The next run is a new process reading the same GPUs.
        lib2, session2 = _node(model, state)
        try:
            reconfigure(session2, cfg, second, lib2.reset)
        except SliceInUse:
            assert busy_uuid is not None
        inv = read_inventory(session2)
        if busy_uuid:
            assert busy_uuid in {s.mig_uuid for s in inv.gpus[0].slices}, (k, mode)
        else:
            assert reconfigure(session2, cfg, second, lib2.reset).done == ()
