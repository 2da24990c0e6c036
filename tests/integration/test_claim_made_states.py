"""What a claim's release destroys, over any order of prepares, refused prepares, releases,
slices made by hand (a MIG config's apply between a driver's look at the GPUs and its change)
and claims' slices lost (a reboot, a hand) and maybe made again before the kubelet asks again,
through the engine as the agent wires it (nodeagent.reconcile.claims `settled`): a release
destroys exactly the slices its claim made, and a slice its claim found outlives it. 1g slices
only, so none is in another's way (the idle slices a claim's slice needs gone are the planner's
tests'). The caller's copy of a claim always says it made nothing (the driver's look, before
the lock) and is flipped at random on release: the record decides, never the copy."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodeagent.agent.factory import command_pipeline
from nodeagent.base.errors import SliceInUse
from nodeagent.dra.cdi import cdi_id
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.nvml.inventory import Placement, Slice
from nodeagent.reconcile.claims import ClaimChange
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.held import PREPARED, PREPARING, PreparedClaim, PreparedDevice

ONE_1G = 19  # the 1g.18gb profile of an H200: seven placements, 0 to 6, none overlapping
GPU = 0
UIDS = [f"5b0e9c1a-7d3e-4c52-9a51-0c6f4f1b2a0{i}" for i in range(3)]
STARTS = st.integers(min_value=0, max_value=6)


class ClaimsAndHands(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lib = SimulatedNvml(parse_spec("h200"))
        self.session = NvmlSession(self.lib)
        MigWriter(self.session).set_mig_mode(GPU, True)
        self.uuid = read_inventory(self.session).gpus[GPU].uuid
        self.root = Path(tempfile.mkdtemp(prefix="claims-"))
        # As the agent wires it: the ownership record beside the MIG writer lock, its claims
        # holders of their devices for every plan.
        self.engine = command_pipeline(
            self.session, Settings(), self.lib.reset, self.root / ".mig.lock"
        )
        self.made_by: dict[int, str] = {}  # placement start -> "hand" or "claims"
        self.claims: dict[str, int] = {}  # prepared claim UID -> its slice's start
        self.shared: dict[int, bool] = {}  # start -> whether its claims share the slice

    def _claim(
        self, uid: str, start: int, share: bool = False, existed: bool = False
    ) -> PreparedClaim:
        name = f"gpu-0-mig-1g18gb-19-{start}" + ("-mps" if share else "")
        device = PreparedDevice(
            "r", "node", name, GPU, self.uuid, ONE_1G, "1g.18gb", start, 1, existed,
            shared=share,
        )  # fmt: skip
        return PreparedClaim("speech", uid[-1], PREPARING, (device,), (), "gpu.nodeagent.io")

    def _holders(self, start: int) -> list[str]:
        return sorted(u for u, s in self.claims.items() if s == start)

    def _slices(self) -> tuple[Slice, ...]:
        return read_inventory(self.session).gpus[GPU].slices

    @rule(start=STARTS)
    def made_by_hand(self, start: int) -> None:
        if start in self.made_by:
            return
        writer = MigWriter(self.session)
        gi = writer.create_gpu_instance(GPU, ONE_1G, Placement(start, 1))
        writer.create_compute_instance(GPU, gi, 1)
        self.made_by[start] = "hand"

    @precondition(lambda self: len(self.claims) < len(UIDS))
    @rule(data=st.data(), start=STARTS, share=st.booleans())
    def prepare(self, data: st.DataObject, start: int, share: bool) -> None:
        """A claim of the slice at `start`, or a share of it (joining the shares there)."""
        if self._holders(start) and not (share and self.shared[start]):
            return  # another claim holds it: refused (refused_prepare)
        uid = data.draw(st.sampled_from([u for u in UIDS if u not in self.claims]))
        self._prepare(uid, start, share)

    def _prepare(self, uid: str, start: int, share: bool) -> None:
        joining = [u for u in self._holders(start) if u != uid]
        done = self.engine.run_change(ClaimChange(uid, self._claim(uid, start, share)))
        assert done.claim is not None
        (device,) = done.claim.devices
        # A share joining others takes their answer; else: found, or made by this claim.
        found = self.made_by.get(start) == "hand" if joining else start in self.made_by
        assert device.existed == found
        self.made_by.setdefault(start, "claims")
        self.claims[uid], self.shared[start] = start, share
        # The driver's last write: the claim prepared, with the MIG device it got.
        (made,) = [s for s in done.inventory.gpus[GPU].slices if s.placement.start == start]
        held = replace(device, gi_id=made.gi_id, ci_id=made.ci_id, mig_uuid=made.mig_uuid)
        ids = (cdi_id("gpu.nodeagent.io", uid, held.device),)
        entry = replace(done.claim, state=PREPARED, devices=(held,), cdi_ids=ids)
        assert self.engine.owners is not None
        self.engine.owners.update(lambda o: o.with_claim(uid, entry))

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), remade=st.booleans())
    def lost_then_prepared_again(self, data: st.DataObject, remade: bool) -> None:
        """A claim's slice (one claim alone holds it) is lost (a reboot, a hand), maybe made
        again by hand at the same placement, and the kubelet asks again: a slice there now is
        found; none, and the claim makes it."""
        alone = [u for u, s in self.claims.items() if self._holders(s) == [u]]
        if not alone:
            return
        uid = data.draw(st.sampled_from(sorted(alone)))
        start = self.claims[uid]
        (lost,) = [s for s in self._slices() if s.placement.start == start]
        writer = MigWriter(self.session)
        writer.destroy_compute_instance(GPU, lost.gi_id, lost.ci_id or 0)
        writer.destroy_gpu_instance(GPU, lost.gi_id)
        del self.made_by[start]
        if remade:
            self.made_by_hand(start)
        self._prepare(uid, start, self.shared[start])

    @precondition(lambda self: bool(self.claims) and len(self.claims) < len(UIDS))
    @rule(data=st.data())
    def refused_prepare(self, data: st.DataObject) -> None:
        """A claim (not a share) of a slice other claims hold is refused before anything is
        recorded; the driver's undo lets go of its own copy, which says it made the slice:
        nothing goes (the record never had the claim)."""
        start = data.draw(st.sampled_from(sorted(set(self.claims.values()))))
        uid = data.draw(st.sampled_from([u for u in UIDS if u not in self.claims]))
        with pytest.raises(SliceInUse):
            self.engine.run_change(ClaimChange(uid, self._claim(uid, start)))
        done = self.engine.run_change(ClaimChange(uid, self._claim(uid, start), release=True))
        assert done.operations == ()
        assert self.engine.owners is not None
        assert uid not in self.engine.owners.read().claims

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), flip=st.booleans())
    def release(self, data: st.DataObject, flip: bool) -> None:
        """A claim let go: the slice goes with the last claim holding it, if claims made it."""
        uid = data.draw(st.sampled_from(sorted(self.claims)))
        start = self.claims.pop(uid)
        goes = self.made_by[start] == "claims" and not self._holders(start)
        copy = self._claim(uid, start, self.shared[start], existed=goes == flip)  # not read
        done = self.engine.run_change(ClaimChange(uid, copy, release=True))
        assert len(done.operations) == (2 if goes else 0)  # its CI and GI, or nothing
        if goes:
            del self.made_by[start]
        assert self.engine.owners is not None
        self.engine.owners.update(lambda o: o.without(uid))  # the driver's last write

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @invariant()
    def the_gpu_holds_what_was_made_and_not_let_go(self) -> None:
        slices = read_inventory(self.session).gpus[GPU].slices
        assert sorted(s.placement.start for s in slices) == sorted(self.made_by)


ClaimsAndHands.TestCase.settings = settings(
    max_examples=40, stateful_step_count=12, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_what_a_release_destroys = ClaimsAndHands.TestCase
