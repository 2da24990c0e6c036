"""What a claim wants (nodeagent.dra.prepared, nodeagent.reconcile.claims), planned by the one MIG planner, on random layouts (hypothesis), executed on the emulator: either only
destroying a busy slice would make room and nothing is planned, or after the operations the
claimed slice is there, every other slice kept has its ids, only idle ones went and no fewer
would do (by tests/support/mig.py's independent rules: overlap, one +me, compute slices), and
a slice already there costs no operation."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import SliceInUse
from nodeagent.dra.claims import ClaimedDevice
from nodeagent.dra.devices import DeviceRef, mig_device_name
from nodeagent.dra.prepared import prepared_devices
from nodeagent.mig.apply import execute
from nodeagent.mig.geometry import Geometry, Instance
from nodeagent.mig.plan import plan
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.reconcile.claims import prepare_wants
from nodeagent.sim import SimulatedNvml
from tests.support.mig import reference_valid

BLANK = SimulatedNvml(["h200"])
GPU = read_inventory(NvmlSession(BLANK)).gpus[0]
GEOMETRY = Geometry.of(GPU)
CANDIDATES = [i for p in GPU.profiles for i in GEOMETRY.instances(p)]


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[Instance], set[int], Instance]:
    layout: list[Instance] = []
    for inst in draw(st.permutations(CANDIDATES)):
        if len(layout) < draw(st.integers(0, 7)) and GEOMETRY.fits(layout, inst):
            layout.append(inst)
    busy = draw(st.sets(st.integers(0, max(len(layout) - 1, 0)), max_size=len(layout)))
    return layout, busy if layout else set(), draw(st.sampled_from(CANDIDATES))


def node(layout: list[Instance], busy: set[int]) -> tuple[SimulatedNvml, NvmlSession]:
    lib = SimulatedNvml(["h200"])
    session = NvmlSession(lib)
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    for i, inst in enumerate(layout):
        gi = writer.create_gpu_instance(0, inst.profile_id, inst.placement)
        slices = GEOMETRY.profile(inst.profile_id).slice_count
        writer.create_compute_instance(0, gi, slices, 0, full=True)
        if i in busy:
            mig = next(s for s in read_inventory(session).gpus[0].slices if s.gi_id == gi)
            lib.attach(str(mig.mig_uuid), 5000 + i, 1 << 20)
    return lib, session


def fewest_removals(layout: list[Instance], busy: set[int], want: Instance) -> int | None:
    """The fewest slices to destroy so that `want` joins the rest, by the independent rules of
    tests/support/mig.py (reference_valid); None when only busy ones would do."""
    cand = [(i.profile_id, i.start, i.size) for i in layout]
    new = (want.profile_id, want.start, want.size)
    for k in range(len(layout) + 1):
        for gone in combinations(range(len(layout)), k):
            kept = [c for i, c in enumerate(cand) if i not in gone]
            if not busy & set(gone) and reference_valid(GPU, [*kept, new]):
                return k
    return None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_the_claimed_slice_is_made_and_only_what_must_goes(
    scene: tuple[list[Instance], set[int], Instance],
) -> None:
    layout, busy, want = scene
    _, session = node(layout, busy)
    before = read_inventory(session)
    profile = GEOMETRY.profile(want.profile_id)
    name = mig_device_name(0, profile, want.start)
    claimed = [ClaimedDevice("r", "n", name, DeviceRef(0, want.profile_id, want.start))]
    wanted = prepared_devices(before, claimed)
    if want in layout:  # there already: used as it is, unless busy
        index = layout.index(want)
        fewest: int | None = None if index in busy else 0
    else:
        fewest = fewest_removals(layout, busy, want)
    try:
        the_plan = plan(before, prepare_wants(before, wanted, {}, "claim t/t"), {})
    except SliceInUse:
        assert fewest is None
        return
    assert fewest is not None
    execute(the_plan, MigWriter(session), lambda i: None)
    after = {(s.profile_id, s.placement.start): s for s in read_inventory(session).gpus[0].slices}
    assert (want.profile_id, want.start) in after
    kept = {(s.profile_id, s.placement.start): s for s in before.gpus[0].slices}
    gone = 0
    for i, inst in enumerate(layout):
        key = (inst.profile_id, inst.start)
        if inst != want and key not in after:
            assert i not in busy
            gone += 1
        else:
            assert after[key].gi_id == kept[key].gi_id and after[key].mig_uuid == kept[key].mig_uuid
    assert gone == fewest
    assert the_plan.mutations == (0 if want in layout else 2 * gone + 2)
