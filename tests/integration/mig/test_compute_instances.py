"""Compute-instance profiles (`<n>c.<g>g.<m>gb`) applied for real on the emulator: several CIs
in one GI, packed as mig-parted fills a GI, changed minimally, in-use CIs kept, and a failure
or a kill at every mutation of a change converges."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError, NvmlError, SliceInUse
from nodeagent.mig.config import MigConfigFile, parse_config
from nodeagent.mig.plan import device_counts
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml
from nodeagent.sim.faults import SimulatedCrash
from nodeagent.sim.models import MIB, parse_spec
from tests.support.mig_apply import assert_config, reconfigure

CONFIGS = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
      mig-devices: {}
  six-1c:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 6}
  mixed-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {"2c.3g.71gb": 2, "1c.3g.71gb": 2}
  seven-in-7g:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.7g.141gb": 7}
  4c-and-3c:
    - devices: all
      mig-enabled: true
      mig-devices: {"4c.7g.141gb": 1, "3c.7g.141gb": 1}
  balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
"""


def _cfg() -> MigConfigFile:
    return parse_config(CONFIGS, "ci.yaml")


def _node(
    state: Path | None = None, faults: list[Fault] | None = None
) -> tuple[SimulatedNvml, NvmlSession]:
    lib = SimulatedNvml(parse_spec("h200"), state, FaultPlan(faults or [], in_process=True))
    return lib, NvmlSession(lib)


def _layout(session: NvmlSession) -> list[tuple[int, str, int, int]]:
    """(GI id, MIG device profile, CI id, CI start) of every compute instance."""
    gpu = read_inventory(session).gpus[0]
    return sorted((s.gi_id, s.device_profile, s.ci_id or 0, s.ci_start) for s in gpu.slices)


def test_several_cis_per_gi_are_created_with_driver_ids() -> None:
    lib, session = _node()
    out = reconfigure(session, _cfg(), "six-1c", lib.reset)
    # Two 3g GIs (ids 1 and 2: the halves), three 1c CIs in each at compute slices 0, 1, 2.
    assert _layout(session) == [(gi, "1c.3g.71gb", ci, ci) for gi in (1, 2) for ci in range(3)]
    assert [d.op.op.value for d in out.done].count("create-ci") == 6
    problems, _ = assert_config(session, _cfg(), "six-1c")
    assert problems == []
    mig = read_inventory(session).gpus[0].slices[0]
    assert mig.mig_uuid and mig.multiprocessor_count == 16  # a 1c on Hopper: one slice, 16 SMs
    # Applied again: nothing to do.
    assert reconfigure(session, _cfg(), "six-1c", lib.reset).done == ()


@pytest.mark.parametrize(
    ("name", "devices"),
    [
        ("seven-in-7g", {"1c.7g.141gb": 7}),
        ("4c-and-3c", {"3c.7g.141gb": 1, "4c.7g.141gb": 1}),
        ("mixed-3g", {"1c.3g.71gb": 2, "2c.3g.71gb": 2}),
    ],
)
def test_compute_instance_layouts_apply_and_verify(name: str, devices: dict[str, int]) -> None:
    lib, session = _node()
    reconfigure(session, _cfg(), name, lib.reset)
    assert device_counts(read_inventory(session).gpus[0]) == devices
    assert assert_config(session, _cfg(), name)[0] == []


def test_change_keeps_the_gi_and_the_compute_instances_it_can() -> None:
    """six 1c (two 3g GIs of 1+1+1) -> 2x2c + 2x1c (two 3g GIs of 2+1): each GI stays; per GI
    the 1c at slice 2 stays, the two at 0 and 1 become one 2c. A process on a kept CI keeps
    running; the GIs are never destroyed."""
    lib, session = _node()
    reconfigure(session, _cfg(), "six-1c", lib.reset)
    busy = next(s for s in read_inventory(session).gpus[0].slices if s.ci_start == 2)
    assert busy.mig_uuid
    lib.attach(busy.mig_uuid, 77, MIB)
    out = reconfigure(session, _cfg(), "mixed-3g", lib.reset)
    ops = [d.op.op.value for d in out.done]
    assert ops == ["destroy-ci"] * 4 + ["create-ci"] * 2
    assert busy.mig_uuid in {s.mig_uuid for s in read_inventory(session).gpus[0].slices}
    assert _layout(session) == [
        (1, "1c.3g.71gb", 2, 2),
        (1, "2c.3g.71gb", 0, 0),
        (2, "1c.3g.71gb", 2, 2),
        (2, "2c.3g.71gb", 0, 0),
    ]


def test_a_busy_compute_instance_is_never_destroyed() -> None:
    lib, session = _node()
    reconfigure(session, _cfg(), "six-1c", lib.reset)
    busy = next(s for s in read_inventory(session).gpus[0].slices if s.ci_start == 1)
    assert busy.mig_uuid
    lib.attach(busy.mig_uuid, 77, MIB)
    before = _layout(session)
    with pytest.raises(SliceInUse, match="in use by pid 77"):
        reconfigure(session, _cfg(), "mixed-3g", lib.reset)  # a 2c at 0 would cover slice 1
    assert _layout(session) == before
    with pytest.raises(SliceInUse):
        reconfigure(session, _cfg(), "all-disabled", lib.reset)
    lib.detach(77)
    reconfigure(session, _cfg(), "all-disabled", lib.reset)
    assert read_inventory(session).gpus[0].mig_current is False


def test_compute_instance_profile_the_gi_lacks_fails_only_that_config() -> None:
    text = CONFIGS + (
        "  three-in-4g:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"3c.4g.71gb": 1}\n'
    )
    cfg = parse_config(text, "ci.yaml")
    lib, session = _node()
    with pytest.raises(ConfigError, match=r"no compute-instance profile 3c.4g.71gb; a 4g.71gb"):
        reconfigure(session, cfg, "three-in-4g", lib.reset)
    reconfigure(session, cfg, "six-1c", lib.reset)  # the file's other configs still apply


def _mutations(cfg: MigConfigFile, second: str, state: Path) -> int:
    lib, session = _node(state)
    with contextlib.suppress(SliceInUse):
        reconfigure(session, cfg, second, lib.reset)
    return lib.faults.mutations


@pytest.mark.parametrize(
    ("first", "second"),
    [("balanced", "six-1c"), ("six-1c", "mixed-3g"), ("mixed-3g", "seven-in-7g")],
)
@pytest.mark.parametrize("mode", ["error", "kill-before", "kill-after"])
def test_failure_at_every_mutation_converges(
    tmp_path: Path, first: str, second: str, mode: str
) -> None:
    cfg = _cfg()
    state = tmp_path / "first.json"
    lib, session = _node(state)
    reconfigure(session, cfg, first, lib.reset)
    start = state.read_bytes()
    (tmp_path / "count.json").write_bytes(start)
    steps = _mutations(cfg, second, tmp_path / "count.json")
    assert steps > 0
    for k in range(1, steps + 1):
        node = tmp_path / f"node-{k}.json"
        node.write_bytes(start)
        lib, session = _node(node)
        at = lib.faults.mutations + k
        fault = (
            Fault(mutation=at, error=999)
            if mode == "error"
            else Fault(mutation=at, exit_code=137, when=mode.split("-")[1])
        )
        lib.faults.faults.append(fault)
        with pytest.raises((NvmlError, SimulatedCrash)):
            reconfigure(session, cfg, second, lib.reset)
        lib2, session2 = _node(node)  # the next run: a new process, the same GPUs
        reconfigure(session2, cfg, second, lib2.reset)
        assert assert_config(session2, cfg, second)[0] == [], (k, mode)
        assert reconfigure(session2, cfg, second, lib2.reset).done == ()


def test_export_names_compute_instances_and_applies_back() -> None:
    from nodeagent.mig.config import dump_config
    from nodeagent.mig.generate import export_current

    lib, session = _node()
    reconfigure(session, _cfg(), "mixed-3g", lib.reset)
    exported = export_current(read_inventory(session))
    assert exported["current"][0]["mig-devices"] == {"1c.3g.71gb": 2, "2c.3g.71gb": 2}
    back = parse_config(dump_config(exported), "current.yaml")
    assert reconfigure(session, back, "current", lib.reset).done == ()


def _busy(lib: SimulatedNvml, session: NvmlSession, where: set[tuple[int, int]]) -> set[str]:
    """Start a process on each (GI id, CI start); returns their MIG UUIDs."""
    uuids = set()
    for pid, s in enumerate(read_inventory(session).gpus[0].slices, start=100):
        if (s.gi_id, s.ci_start) in where and s.mig_uuid:
            lib.attach(s.mig_uuid, pid, MIB)
            uuids.add(s.mig_uuid)
    return uuids


def _devices_of(session: NvmlSession) -> set[str]:
    return {s.mig_uuid for s in read_inventory(session).gpus[0].slices if s.mig_uuid}


@pytest.mark.parametrize(
    ("first", "busy", "second"),
    [
        # The GI whose CIs already match must not take the only shape a busy GI can have.
        ({"1c.3g.71gb": 6}, {(1, 1), (2, 0), (2, 2)}, {"1c.3g.71gb": 4}),
        ({"2c.3g.71gb": 2, "1c.3g.71gb": 1}, {(2, 0)}, {"2c.3g.71gb": 1, "1c.3g.71gb": 4}),
        # The preferred grouping (3 + 1) would destroy a busy CI; 2 + 2 is the same devices.
        ({"1c.3g.71gb": 6}, {(1, 0), (1, 1), (2, 0), (2, 1)}, {"1c.3g.71gb": 4}),
    ],
)
def test_busy_compute_instances_are_kept_when_any_grouping_allows(
    first: dict[str, int], busy: set[tuple[int, int]], second: dict[str, int]
) -> None:
    """Found by a second read: a greedy choice of shapes, or one fixed grouping, refused
    changes that can be made without touching a busy compute instance."""

    def config(name: str, devices: dict[str, int]) -> str:
        return f"  {name}:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {devices}\n"

    cfg = parse_config(
        "version: v1\nmig-configs:\n" + config("first", first) + config("second", second), "c.yaml"
    )
    lib, session = _node()
    reconfigure(session, cfg, "first", lib.reset)
    kept = _busy(lib, session, busy)
    assert len(kept) == len(busy)
    reconfigure(session, cfg, "second", lib.reset)
    assert kept <= _devices_of(session)
    assert assert_config(session, cfg, "second")[0] == []
    assert reconfigure(session, cfg, "second", lib.reset).done == ()


def test_huge_numbers_are_one_sentence() -> None:
    big = parse_config(
        "version: v1\nmig-configs:\n  b:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"1c.3g.71gb": 100000}\n',
        "b.yaml",
    )
    lib, session = _node()
    with pytest.raises(ConfigError, match=r"holds at most 6x1c.3g.71gb; asked for 100000"):
        reconfigure(session, big, "b", lib.reset)
    with pytest.raises(ConfigError, match="malformed number"):
        parse_config(
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n"
            f'      mig-devices:\n        ? "{"1" * 5000}g.5gb"\n        : 1\n',  # a long key
            "a.yaml",
        )
