"""A claim's change (nodeagent.mig.wanted, the DRA driver's) through the pipeline's own steps,
on the emulator: the GPUs it names change and nothing else; no GPU client is paused and no
state is reported; the owners are recorded before the first NVML operation and after the
last; the hooks run only around operations; /healthz's `applying` holds while NVML changes a
GPU for a claim as for a MIG config; each operation comes back typed, with its duration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from nodeagent.agent.factory import command_pipeline
from nodeagent.base.errors import SliceInUse
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.plan import Op
from nodeagent.mig.select import MigTarget
from nodeagent.mig.wanted import WantedChange
from nodeagent.mps.manager import MpsManager
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.reconcile import Pipeline, Report, SettingsDesire, Wanted, no_lock
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Snapshot, Store
from tests.support.agent import make_settings

CREATE_GI = "nvmlDeviceCreateGpuInstanceWithPlacement"
ONE_1G = 19  # the 1g.18gb profile of an H200


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


def _one_1g(gpu: int) -> MigTarget:
    return MigTarget(gpu, True, {ONE_1G: 1}, "claim")


def _change(wanted: MigTarget, recorded: list[tuple[int, bool]]) -> WantedChange:
    def record(inventory: Inventory, done: bool) -> None:
        recorded.append((len(inventory.gpus[wanted.gpu].slices), done))

    return WantedChange("claim speech/asr", lambda _inv, _held: {wanted.gpu: wanted}, "me", record)


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
        ),
        lib,
        world,
    )


def test_a_claims_change_runs_the_steps_on_its_gpus_only(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    engine, lib, world = pipeline
    applying: list[bool] = []
    lib.latency = {CREATE_GI: 1e-9}  # the emulator "blocks" in the create call: look then
    lib.sleep = lambda _seconds: applying.append(engine.applying)
    recorded: list[tuple[int, bool]] = []

    done = engine.run_change(_change(_one_1g(1), recorded))

    assert applying == [True]  # /healthz and shutdown know a MIG change holds NVML
    assert not engine.applying
    assert world.calls == []  # no client paused, no "pending", no labels, no report
    assert recorded == [(0, False), (1, True)]  # before the first operation, after the last
    assert [d.op.op for d in done.operations] == [Op.SET_MIG_MODE, Op.CREATE_GI, Op.CREATE_CI]
    assert all(d.seconds >= 0 and d.op.gpu == 1 for d in done.operations)
    (made,) = done.inventory.gpus[1].slices
    assert (done.operations[1].gi_id, done.operations[2].ci_id) == (made.gi_id, made.ci_id)
    assert not done.inventory.gpus[0].mig_current  # the GPU it does not name is left alone
    assert {"observe", "plan", "pause", "apply", "verify", "cdi"} <= set(engine.stats.steps)
    # Asked again: the GPUs are as it wants; nothing more is done, the owners recorded again.
    again = engine.run_change(_change(_one_1g(1), recorded))
    assert again.operations == () and recorded[2:] == [(1, False), (1, True)]


def test_a_claim_the_gpus_cannot_hold_fails_plan_and_changes_nothing(
    pipeline: tuple[Pipeline, SimulatedNvml, World],
) -> None:
    engine, _lib, world = pipeline

    def refuse(_inventory: Inventory, _held: Mapping[str, str]) -> dict[int, MigTarget]:
        raise SliceInUse("gpu-1-mig-1g18gb-19-0: pod speech/other holds memory slice 0")

    before = read_inventory(engine.store.session)
    with pytest.raises(SliceInUse, match="pod speech/other"):
        engine.run_change(WantedChange("claim speech/asr", refuse))
    assert read_inventory(engine.store.session).gpus == before.gpus
    assert world.calls == [] and not engine.applying


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

    engine.run_change(_change(_one_1g(0), []))
    assert log.read_text().split() == list(names)
    engine.run_change(_change(_one_1g(0), []))
    assert log.read_text().split() == list(names)
