"""The reconcile pipeline, step by step, on the emulator: both desire sources (settings, node
label) through the one path; every failure names its step; clients always restored; a read
that finished late never replaces a newer snapshot."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.metrics.agent import AgentStats
from nodeagent.mig.config import dump_config
from nodeagent.mig.generate import generate_configs
from nodeagent.mps.manager import MpsManager
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.reconcile import Pipeline, Report, SettingsDesire, Wanted, no_lock
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault
from nodeagent.state.snapshot import Snapshot, Store
from tests.support.agent import make_settings

IN_USE, UNKNOWN = 19, 999


@dataclass
class LabelDesire:
    """Stands in for the node label source: the name a user set, tracked."""

    name: str | None

    def wanted(self, settings: Settings) -> Wanted:
        return Wanted("node-label", self.name, tracked=self.name is not None)


@dataclass
class Recorder:
    """Reporter, clients and label sink at once: what the pipeline told the world, in order."""

    calls: list[str] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    labels: list[Mapping[str, str]] = field(default_factory=list)
    fail_pause: bool = False
    name: str = "recorder"

    def changing(self, wanted: Wanted, operations: int) -> None:
        self.calls.append(f"changing {wanted.mig_config} {operations}")

    def finished(self, report: Report) -> None:
        self.calls.append(f"finished {report.result}")
        self.reports.append(report)

    def pause(self) -> None:
        self.calls.append("pause")
        if self.fail_pause:
            raise KubeError("GPU clients did not leave the node within 1 s")

    def restore(self) -> None:
        self.calls.append("restore")

    def publish(self, labels: Mapping[str, str], snapshot: Snapshot) -> None:
        self.calls.append("publish")
        self.labels.append(labels)


@pytest.fixture
def node(tmp_path: Path) -> Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]]:
    def make(
        source: str = "settings", name: str | None = "all-balanced", **kw: Any
    ) -> tuple[Pipeline, SimulatedNvml, Recorder]:
        lib = SimulatedNvml(parse_spec("h200x2"))
        session = NvmlSession(lib)
        mig = tmp_path / "mig.yaml"
        mig.write_text(dump_config(generate_configs(read_inventory(session))))
        config = name if source == "settings" else None
        settings = make_settings(mig={"config_file": str(mig), "config": config})
        rec = Recorder(**kw)
        pipeline = Pipeline(
            store=Store(session, lambda: 0.0),
            settings=lambda: settings,
            desire=SettingsDesire() if source == "settings" else LabelDesire(name),
            reset=lambda _s: lib.reset,
            mps=MpsManager(),
            stats=AgentStats(),
            writer_lock=no_lock,
            sinks=[rec],
            clients=lambda _s: rec,
            reporter=rec,
        )
        return pipeline, lib, rec

    return make


def _slices(lib: SimulatedNvml) -> list[int]:
    return [len(g.gis) for g in lib.state.gpus]


@pytest.mark.parametrize("source", ["settings", "node-label"])
def test_one_path_for_both_sources(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]], source: str
) -> None:
    pipeline, lib, rec = node(source)
    report = pipeline.run_once()
    assert report.result == "success" and report.operations == 18
    assert report.wanted.origin == source
    assert _slices(lib) == [4, 4]
    assert rec.calls == [
        "changing all-balanced 18",
        "pause",
        "restore",
        "publish",
        "finished success",
    ]
    assert rec.labels[-1]["nvidia.com/mig-3g.71gb.count"] == "2"
    # Converged: the next run changes nothing, pauses nobody, publishes again.
    rec.calls.clear()
    report = pipeline.run_once()
    assert report.result == "success" and report.operations == 0
    assert rec.calls == ["publish", "finished success"]
    steps = set(pipeline.stats.steps)
    assert {"observe", "desire", "resolve", "plan", "pause", "apply", "verify"} <= steps
    assert {"restore", "publish", "report"} <= steps


def _bad_bytes(pipeline: Pipeline) -> None:
    path = Path(pipeline.settings().mig.config_file or "")
    path.write_bytes(b"# \xff\n" + path.read_bytes())


def _in_use(pipeline: Pipeline, lib: SimulatedNvml) -> None:
    pipeline.run_once()  # all-balanced, then a process on a 3g that all-7g must destroy
    uuid = next(s.mig_uuid for s in read_inventory(pipeline.store.session).gpus[0].slices
                if s.profile == "3g.71gb")  # fmt: skip
    lib.attach(uuid or "", 4242, 1 << 30, 0.5)


@pytest.mark.parametrize(
    ("name", "prepare", "step", "words"),
    [
        ("all-9g.999gb", None, "resolve", ["no config named 'all-9g.999gb'", "all-balanced"]),
        ("all-balanced", _bad_bytes, "resolve", ["not UTF-8"]),
        (
            "all-balanced",
            lambda p, lib: lib.faults.faults.append(
                Fault(function="nvmlDeviceGetMemoryInfo", error=UNKNOWN)
            ),
            "observe",
            ["nvmlDeviceGetMemoryInfo"],
        ),
        (
            "all-balanced",
            lambda p, lib: lib.faults.faults.append(
                Fault(function="nvmlDeviceCreateGpuInstanceWithPlacement", call=3, error=IN_USE)
            ),
            "apply",
            ["nvmlDeviceCreateGpuInstanceWithPlacement"],
        ),
    ],
)
def test_failures_name_their_step(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
    name: str,
    prepare: Callable[..., None] | None,
    step: str,
    words: list[str],
) -> None:
    pipeline, lib, rec = node("node-label", name)
    if prepare is not None:
        if prepare is _bad_bytes:
            prepare(pipeline)
        else:
            prepare(pipeline, lib)
    report = pipeline.run_once()
    assert report.result == "failure" and report.step == step
    assert report.reason is not None and report.reason.startswith(f"{step}: ")
    for word in words:
        assert word in report.reason
    assert rec.reports[-1] is report
    assert report.config_failed == (step != "observe")
    if step in ("resolve", "observe"):
        assert _slices(lib) == [0, 0]  # nothing changed before the whole node was planned
    if step == "apply":
        assert rec.calls[-3:] == ["restore", "publish", "finished failure"]  # clients back


def test_a_slice_in_use_fails_plan_and_changes_nothing(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
) -> None:
    pipeline, lib, rec = node("node-label", "all-balanced")
    _in_use(pipeline, lib)
    before = read_inventory(pipeline.store.session)
    pipeline.desire.name = "all-7g.141gb"  # type: ignore[attr-defined]  # the label changes
    report = pipeline.run_once()
    assert report.step == "plan" and "4242" in (report.reason or "")
    assert read_inventory(pipeline.store.session).gpus == before.gpus
    assert "pause" not in rec.calls[-3:]


def test_clients_that_do_not_leave_fail_pause_and_are_restored(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
) -> None:
    pipeline, lib, rec = node("node-label", "all-balanced", fail_pause=True)
    report = pipeline.run_once()
    assert report.step == "pause" and "did not leave" in (report.reason or "")
    assert rec.calls == [
        "changing all-balanced 18", "pause", "restore", "publish", "finished failure",
    ]  # fmt: skip
    assert _slices(lib) == [0, 0]


def test_an_unexpected_exception_is_a_failed_step_not_a_dead_worker(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
) -> None:
    pipeline, _, _ = node()

    def broken(_settings: Settings) -> Wanted:
        raise ZeroDivisionError("bug")

    pipeline.desire.wanted = broken  # type: ignore[method-assign]
    report = pipeline.run_once()
    assert (
        report.step == "desire"
        and report.reason == "desire: internal error: ZeroDivisionError('bug')"
    )


def test_a_late_read_never_replaces_a_newer_snapshot() -> None:
    """Read A starts first, but its kubelet answer comes last: B (newer) stays published."""
    session = NvmlSession(SimulatedNvml(parse_spec("h200")))
    store = Store(session, lambda: 0.0)
    release_a, a_waiting = threading.Event(), threading.Event()

    def slow_kubelet() -> dict[str, str]:
        a_waiting.set()
        assert release_a.wait(10)
        return {"GPU-old": "pod a/old"}

    result: list[Snapshot] = []
    reader = threading.Thread(target=lambda: result.append(store.observe(slow_kubelet)))
    reader.start()
    assert a_waiting.wait(10)
    newer = store.observe(lambda: {})
    release_a.set()
    reader.join(10)
    assert store.snapshot is newer and result == [newer]
    assert store.dropped == 1


def test_concurrent_refreshes_around_an_apply_publish_in_order(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
) -> None:
    """Refreshes hammer the store from four threads while the pipeline changes MIG: every
    snapshot ever published has a higher generation than the one before, and the last one
    shows the new geometry."""
    pipeline, _lib, _ = node()
    store = pipeline.store
    published: list[int] = []
    original = store.offer

    recording = threading.Lock()  # the record's order is the order of publishing

    def offer(snap: Snapshot) -> Snapshot:
        with recording:
            got = original(snap)
            if got is snap:
                published.append(snap.generation)
            return got

    store.offer = offer  # type: ignore[method-assign]
    stop = threading.Event()

    def refresh() -> None:
        while not stop.is_set():
            store.observe()

    threads = [threading.Thread(target=refresh) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert pipeline.run_once().result == "success"
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert published == sorted(published) and len(published) == len(set(published))
    snap = store.observe()
    assert [len({s.gi_id for s in g.slices}) for g in snap.inventory.gpus] == [4, 4]


def test_a_change_another_writer_made_while_this_one_waited_for_the_lock_is_success(
    node: Callable[..., tuple[Pipeline, SimulatedNvml, Recorder]],
) -> None:
    """The other writer (a `mig apply`, an old agent) applies the same config while this run
    waits for the MIG writer lock: apply plans again and has nothing to do, and verify checks
    the GPUs as they are now, not as plan saw them."""
    other, lib, _ = node()

    @contextlib.contextmanager
    def lock_after_the_other(_settings: Settings) -> Iterator[None]:
        assert other.run_once().result == "success"  # it held the lock first
        yield

    pipeline = dataclasses.replace(other, writer_lock=lock_after_the_other)  # the same node
    report = pipeline.run_once()
    assert report.result == "success", report.reason
    assert report.operations == 0 and _slices(lib) == [4, 4]
