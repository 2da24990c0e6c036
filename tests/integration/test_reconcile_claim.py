"""A claim's change (nodeagent.reconcile.claims `ClaimChange`, the DRA driver's) through the
pipeline's own steps, on the emulator, with no DRA driver: the GPUs its devices need change
and nothing else; no GPU client is paused and no state is reported; the engine records the
claim `preparing` in the ownership record before the first NVML operation and, let go,
holding nothing after the last; a slice another claim holds refuses it; the hooks run only
around operations; /healthz's `applying` holds while NVML changes a GPU for a claim as for a
MIG config; each operation comes back typed, with its duration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from nodeagent.agent.factory import command_pipeline
from nodeagent.base.errors import ConfigError, SliceInUse
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.plan import Op
from nodeagent.mps.manager import MpsManager
from nodeagent.nvml import MigWriter, NvmlSession, read_inventory
from nodeagent.nvml.inventory import Placement
from nodeagent.reconcile import Pipeline, Report, SettingsDesire, Wanted, no_lock
from nodeagent.reconcile.claims import ClaimChange
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.held import (
    PREPARED,
    PREPARING,
    UNPREPARING,
    PreparedClaim,
    PreparedDevice,
    on_gpu,
)
from nodeagent.state.owners import OwnerStore
from nodeagent.state.record import Owners
from nodeagent.state.snapshot import Snapshot, Store
from tests.support.agent import make_settings

CREATE_GI = "nvmlDeviceCreateGpuInstanceWithPlacement"
ONE_1G = 19  # the 1g.18gb profile of an H200
UID = "5b0e9c1a-7d3e-4c52-9a51-0c6f4f1b2a01"
OTHER = "5b0e9c1a-7d3e-4c52-9a51-0c6f4f1b2a02"


@dataclass
class World:
    """Reporter, GPU clients and label sink at once: what the pipeline told the world."""

    calls: list[str] = field(default_factory=list)
    name: str = "world"

    def changing(self, wanted: Wanted, operations: int) -> None:
        self.calls.append("changing")

    def finished(self, report: Report) -> None:
        self.calls.append("finished")

    def pause(self) -> None:
        self.calls.append("pause")

    def restore(self) -> None:
        self.calls.append("restore")

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        self.calls.append("publish")


def _claim(lib: SimulatedNvml, gpu: int, name: str = "asr") -> PreparedClaim:
    """A claim of one new 1g.18gb slice at placement 0 of GPU `gpu`, as the driver makes it."""
    uuid = read_inventory(NvmlSession(lib)).gpus[gpu].uuid
    device = PreparedDevice(
        "r", "node", f"gpu-{gpu}-mig-1g18gb-19-0", gpu, uuid, ONE_1G, "1g.18gb", 0, 1, False
    )
    return PreparedClaim("speech", name, PREPARING, (device,), (), "gpu.nodeagent.io")


@pytest.fixture
def pipeline() -> tuple[Pipeline, SimulatedNvml, World]:
    lib = SimulatedNvml(parse_spec("h200x2"))
    world = World()
    settings = Settings()
    return (
        Pipeline(
            store=Store(NvmlSession(lib), lambda: 0.0),
            settings=lambda: settings,
            desire=SettingsDesire(),
            reset=lambda _s: lib.reset,
            mps=MpsManager(),
            stats=AgentStats(),
            writer_lock=no_lock,
            sinks=(world,),
            clients=lambda _s: world,
            reporter=world,
            owners=OwnerStore(None, lambda _inventory: Owners()),
        ),
        lib,
        world,
    )


def test_a_claims_change_runs_the_steps_on_its_gpus_only(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    engine, lib, world = pipeline
    record = engine.owners
    assert record is not None
    applying: list[bool] = []
    recorded: list[str | None] = []
    lib.latency = {CREATE_GI: 1e-9}  # the emulator "blocks" in the create call: look then

    def look(_seconds: float) -> None:
        applying.append(engine.applying)
        recorded.append(record.read().claims[UID].state)

    lib.sleep = look
    claim = _claim(lib, 1)

    done = engine.run_change(ClaimChange(UID, claim))

    assert applying == [True]  # /healthz and shutdown know a MIG change holds NVML
    assert recorded == [PREPARING]  # the engine recorded it before the first operation
    assert not engine.applying
    assert world.calls == []  # no client paused, no "pending", no labels, no report
    assert [d.op.op for d in done.operations] == [Op.SET_MIG_MODE, Op.CREATE_GI, Op.CREATE_CI]
    assert all(d.seconds >= 0 and d.op.gpu == 1 for d in done.operations)
    (made,) = done.inventory.gpus[1].slices
    assert (done.operations[1].gi_id, done.operations[2].ci_id) == (made.gi_id, made.ci_id)
    assert not done.inventory.gpus[0].mig_current  # the GPU it does not name is left alone
    assert {"observe", "plan", "pause", "apply", "verify", "cdi"} <= set(engine.stats.steps)
    assert done.claim == record.read().claims[UID] == claim  # nothing there before: made by it
    # Asked again: the GPUs are as it wants; nothing more is done.
    again = engine.run_change(ClaimChange(UID, claim))
    assert again.operations == () and record.read().claims[UID] == claim
    # Let go: the slice it made goes, and the engine records it holding nothing.
    gone = engine.run_change(ClaimChange(UID, claim, release=True))
    assert [d.op.op for d in gone.operations] == [Op.DESTROY_CI, Op.DESTROY_GI]
    assert not read_inventory(engine.store.session).gpus[1].slices
    assert record.read().claims[UID] == PreparedClaim(
        "speech", "asr", UNPREPARING, (), (), "gpu.nodeagent.io"
    )


def test_a_slice_another_claim_holds_refuses_the_claim_and_changes_nothing(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    engine, lib, world = pipeline
    assert engine.owners is not None
    other = _claim(lib, 1, "other")
    engine.owners.write(Owners({OTHER: other}))
    before = read_inventory(engine.store.session)

    with pytest.raises(SliceInUse, match="claim speech/other holds memory slices 0-0 of GPU 1"):
        engine.run_change(ClaimChange(UID, _claim(lib, 1)))
    assert read_inventory(engine.store.session).gpus == before.gpus
    assert engine.owners.read() == Owners({OTHER: other})  # nothing recorded
    assert world.calls == [] and not engine.applying


def test_a_claims_steps_reach_the_step_metric_once_its_run_ends_refused_or_not(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """A step calls nothing beside its own work: the run keeps each step's duration and the
    step metric takes them as the run ends, each step once, a refused change's steps too."""
    engine, lib, _world = pipeline
    assert engine.owners is not None

    def counts() -> dict[str, float]:  # {step: samples in the step metric}
        return {k: v[-1] for k, v in engine.stats.steps.items()}

    counted: list[dict[str, float]] = []
    lib.latency = {CREATE_GI: 1e-9}
    lib.sleep = lambda _s: counted.append(counts())

    engine.run_change(ClaimChange(UID, _claim(lib, 1)))

    assert counted == [{}]  # nothing observed while the change ran
    assert counts() == {"pause": 1, "observe": 1, "plan": 1, "apply": 1, "verify": 1, "cdi": 1}

    engine.owners.write(Owners({OTHER: _claim(lib, 0, "other")}))
    with pytest.raises(SliceInUse):
        engine.run_change(ClaimChange(UID, _claim(lib, 0)))
    assert counts() == {"pause": 2, "observe": 2, "plan": 2, "apply": 1, "verify": 1, "cdi": 1}


def test_the_hooks_run_around_a_claims_operations_only(tmp_path: Path) -> None:
    """apply-start, pre-apply-mode, pre-apply-config, apply-exit around a change that makes
    a slice; none around one that changes nothing, even on a command's pipeline (whose MIG
    config runs apply-start and apply-exit around every run, as mig-parted's apply)."""
    names = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
    log = tmp_path / "hooks.log"
    hooks = {n: [{"command": "/bin/sh", "args": ["-c", f"echo {n} >> {log}"]}] for n in names}
    (tmp_path / "hooks.yaml").write_text(yaml.safe_dump({"version": "v1", "hooks": hooks}))
    settings = make_settings(mig={"hooks_file": str(tmp_path / "hooks.yaml")})
    lib = SimulatedNvml(parse_spec("h200"))
    engine = command_pipeline(NvmlSession(lib), settings, lib.reset, tmp_path / ".mig.lock")

    engine.run_change(ClaimChange(UID, _claim(lib, 0)))
    assert log.read_text().split() == list(names)
    engine.run_change(ClaimChange(UID, _claim(lib, 0)))
    assert log.read_text().split() == list(names)


def _made_by_hand(lib: SimulatedNvml, gpu: int) -> None:
    """The 1g.18gb slice at placement 0 of GPU `gpu`, made outside the claim (a MIG config's
    apply, say) after the driver read the GPUs."""
    writer = MigWriter(NvmlSession(lib))
    writer.set_mig_mode(gpu, True)
    writer.create_compute_instance(gpu, writer.create_gpu_instance(gpu, ONE_1G, Placement(0, 1)), 1)


def test_whether_a_claim_made_its_slice_is_decided_under_the_lock_not_from_the_drivers_read(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """The driver's devices say the slice is not there (it read the GPUs before the lock);
    another change made it since: the engine records the claim as having found it, so its
    release leaves the slice."""
    engine, lib, _world = pipeline
    assert engine.owners is not None
    claim = _claim(lib, 1)  # existed=False, as the driver's read had it
    _made_by_hand(lib, 1)

    done = engine.run_change(ClaimChange(UID, claim))

    assert done.operations == ()
    assert done.claim is not None and [d.existed for d in done.claim.devices] == [True]
    assert engine.owners.read().claims[UID] == done.claim
    gone = engine.run_change(ClaimChange(UID, claim, release=True))  # the caller's copy says
    assert gone.operations == ()  # made, but the record says found: the slice stays
    assert len(read_inventory(engine.store.session).gpus[1].slices) == 1


def test_a_retry_keeps_its_first_answer_and_a_release_goes_by_the_record(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """A prepare cut short after it made the slice is asked again: the slice is there now, but
    the record says the claim made it, and the claim's release destroys it even when the
    caller's copy of the claim says it found it."""
    engine, lib, _world = pipeline
    assert engine.owners is not None
    claim = _claim(lib, 1)
    engine.run_change(ClaimChange(UID, claim))  # made it (recorded `preparing`, existed=False)

    again = engine.run_change(ClaimChange(UID, claim))
    assert again.claim is not None and [d.existed for d in again.claim.devices] == [False]
    found = replace(claim, devices=tuple(replace(d, existed=True) for d in claim.devices))
    gone = engine.run_change(ClaimChange(UID, found, release=True))
    assert [d.op.op for d in gone.operations] == [Op.DESTROY_CI, Op.DESTROY_GI]


def test_a_share_of_a_slice_others_share_takes_their_answer(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """The slice was made for the first share: the second share, which finds it there, takes
    the first one's answer (made), so the slice goes with the last claim sharing it."""
    engine, lib, _world = pipeline
    assert engine.owners is not None

    def share(name: str) -> PreparedClaim:
        c = _claim(lib, 1, name)
        return replace(c, devices=tuple(replace(d, shared=True) for d in c.devices))

    first = engine.run_change(ClaimChange(OTHER, share("tts")))
    second = engine.run_change(ClaimChange(UID, share("asr")))
    assert first.claim is not None and second.claim is not None
    assert [d.existed for d in first.claim.devices + second.claim.devices] == [False, False]


def _traced(lib: SimulatedNvml, gpu: int, shared: bool = False) -> PreparedClaim:
    """The record's entry for a claim rebuilt from the DRA checkpoint's traces alone (state
    None): its slice as found, nothing known of whether it made it."""
    g = read_inventory(NvmlSession(lib)).gpus[gpu]
    device = on_gpu(
        gpu, g.uuid, (0, 1, ONE_1G), g.slices[0].mig_uuid, device=f"gpu-{gpu}-mig-1g18gb-19-0",
        shared=shared,
    )  # fmt: skip
    return PreparedClaim("", "", None, (device,))


def test_a_claim_known_from_traces_only_says_nothing_of_what_it_made(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """Let go, it destroys nothing; prepared again, its entry is no first answer; shared, its
    entry gives a new share no answer: the slice there is found in each case."""
    engine, lib, _world = pipeline
    assert engine.owners is not None
    _made_by_hand(lib, 1)
    engine.owners.update(lambda o: o.with_claim(UID, _traced(lib, 1)))

    gone = engine.run_change(ClaimChange(UID, PreparedClaim("", "", PREPARING), release=True))
    assert gone.operations == () and len(read_inventory(NvmlSession(lib)).gpus[1].slices) == 1

    engine.owners.update(lambda o: o.with_claim(UID, _traced(lib, 1)))
    again = engine.run_change(ClaimChange(UID, _claim(lib, 1)))
    assert again.claim is not None and [d.existed for d in again.claim.devices] == [True]

    engine.owners.update(lambda o: o.without(UID).with_claim(OTHER, _traced(lib, 1, shared=True)))
    share = _claim(lib, 1)
    share = replace(share, devices=tuple(replace(d, shared=True) for d in share.devices))
    joined = engine.run_change(ClaimChange(UID, share))
    assert joined.claim is not None and [d.existed for d in joined.claim.devices] == [True]


def test_a_claim_prepared_again_finds_a_slice_made_since_its_own_was_lost(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """The claim made its slice; the slice was lost (a reboot, a hand) and someone made another
    at the same placement before the kubelet asked again: that one is found, not made, and the
    claim's release leaves it."""
    engine, lib, _world = pipeline
    assert engine.owners is not None
    claim = _claim(lib, 1)
    done = engine.run_change(ClaimChange(UID, claim))
    assert done.claim is not None
    (made,) = done.inventory.gpus[1].slices
    (device,) = done.claim.devices
    recorded = replace(
        done.claim, state=PREPARED, devices=(replace(device, mig_uuid=made.mig_uuid),),
        cdi_ids=("k8s.gpu.nodeagent.io/claim=x",),
    )  # fmt: skip
    engine.owners.update(lambda o: o.with_claim(UID, recorded))
    writer = MigWriter(NvmlSession(lib))
    writer.destroy_compute_instance(1, made.gi_id, made.ci_id or 0)
    writer.destroy_gpu_instance(1, made.gi_id)
    _made_by_hand(lib, 1)  # another slice, another MIG UUID, the same placement

    again = engine.run_change(ClaimChange(UID, claim))

    assert again.claim is not None and [d.existed for d in again.claim.devices] == [True]
    gone = engine.run_change(ClaimChange(UID, claim, release=True))
    assert gone.operations == () and len(read_inventory(NvmlSession(lib)).gpus[1].slices) == 1


def test_a_claim_another_driver_recorded_is_refused_and_never_released_by_this_one(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    """The record keeps one entry a claim UID: a claim one nodeagent driver prepared is refused
    to a second driver on the node (in one sentence, nothing changed), and the second one's
    undo destroys nothing of the first one's and leaves its entry."""
    engine, lib, _world = pipeline
    assert engine.owners is not None
    mine = _claim(lib, 1)
    engine.run_change(ClaimChange(UID, mine))
    recorded = engine.owners.read().claims[UID]
    theirs = replace(mine, driver="other.nodeagent.io")

    with pytest.raises(
        ConfigError, match=r"has the claim as prepared by DRA driver 'gpu\.nodeagent\.io'"
    ):
        engine.run_change(ClaimChange(UID, theirs))
    undo = engine.run_change(ClaimChange(UID, theirs, release=True))

    assert undo.operations == ()
    assert len(read_inventory(NvmlSession(lib)).gpus[1].slices) == 1
    assert engine.owners.read().claims[UID] == recorded
