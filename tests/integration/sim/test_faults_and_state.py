"""Emulator fault injection and state kept across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nodeagent.base.errors import NvmlError, SimError
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.nvml.codes import IN_USE, NOT_FOUND
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml
from nodeagent.sim.faults import parse_faults


def _writer(faults: list[Fault], state: Path | None = None) -> tuple[NvmlSession, MigWriter]:
    session = NvmlSession(SimulatedNvml(["h200"], state, FaultPlan(faults)))
    return session, MigWriter(session)


def test_every_call_of_a_function_fails() -> None:
    fn = "nvmlDeviceCreateGpuInstanceWithPlacement"
    session, w = _writer([Fault(function=fn, error=IN_USE)])
    w.set_mig_mode(0, True)
    for start in (0, 1):
        with pytest.raises(NvmlError) as err:
            w.create_gpu_instance(0, 19, Placement(start, 1))
        assert err.value.code == IN_USE and err.value.function == fn
    assert read_inventory(session).gpus[0].slices == ()
    assert session.errors_by_function[fn] == 2


def test_nth_call_of_a_function_fails_once() -> None:
    fn = "nvmlDeviceCreateGpuInstanceWithPlacement"
    session, w = _writer([Fault(function=fn, call=2, error=NOT_FOUND)])
    w.set_mig_mode(0, True)
    w.create_gpu_instance(0, 19, Placement(0, 1))
    with pytest.raises(NvmlError):
        w.create_gpu_instance(0, 19, Placement(1, 1))
    w.create_gpu_instance(0, 19, Placement(2, 1))
    assert [s.placement.start for s in read_inventory(session).gpus[0].slices] == [0, 2]


def test_nth_call_overall_fails() -> None:
    plan = FaultPlan([Fault(call=3, error=IN_USE)])
    lib = SimulatedNvml(["h200"], None, plan)
    lib.nvmlInit()  # call 1
    lib.nvmlDeviceGetCount()  # call 2
    with pytest.raises(lib.NVMLError_InUse):
        lib.nvmlDeviceGetCount()  # call 3
    assert lib.nvmlDeviceGetCount() == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_exit_at_a_mutation_leaves_the_state_of_that_moment(tmp_path: Path, when: str) -> None:
    """A kill before the 2nd mutation leaves 1 GI; after it, 2 (saved, then the process died)."""
    state = tmp_path / "node.json"
    script = (
        "from pathlib import Path\n"
        "from nodeagent.nvml import MigWriter, NvmlSession, Placement\n"
        "from nodeagent.sim import SimulatedNvml, FaultPlan\n"
        f"s = NvmlSession(SimulatedNvml(['h200'], Path({str(state)!r}), FaultPlan.from_env()))\n"
        "w = MigWriter(s)\n"
        "w.set_mig_mode(0, True)\n"
        "for start in range(4):\n"
        "    w.create_gpu_instance(0, 19, Placement(start, 1))\n"
    )
    env = dict(
        os.environ, NODEAGENT_SIM_FAULTS=json.dumps([{"mutation": 3, "exit": 137, "when": when}])
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 137
    session = NvmlSession(SimulatedNvml(["h200"], state))
    gis = read_inventory(session).gpus[0].slices
    assert len(gis) == (1 if when == "before" else 2)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON"),
        ('{"a": 1}', "JSON list"),
        ('[{"call": 1}]', "exactly one"),
        ('[{"call": 1, "error": "NO_SUCH"}]', "unknown NVML error"),
        ('[{"call": 1, "exit": 1, "when": "during"}]', "before"),
        ('[{"cal": 1, "exit": 1}]', "bad rule"),
    ],
)
def test_bad_fault_rules_are_refused(text: str, words: str) -> None:
    with pytest.raises(SimError, match=words):
        parse_faults(text)


def test_error_names_and_codes_are_accepted() -> None:
    faults = parse_faults(
        '[{"error": "NVML_ERROR_IN_USE"}, {"error": 23, "function": "nvmlDeviceGetCount"}]'
    )
    assert [f.error for f in faults] == [IN_USE, 23]


def test_a_running_process_sees_changes_made_by_another(tmp_path: Path) -> None:
    """The daemon keeps its emulator open while `nodeagent sim attach` changes the file."""
    state = tmp_path / "node.json"
    daemon = NvmlSession(SimulatedNvml(["h200"], state))
    other = SimulatedNvml(["h200"], state)
    other.attach("0", 55, 1024 * 1024 * 1024)
    assert [p.pid for p in read_inventory(daemon).gpus[0].processes] == [55]
    MigWriter(daemon).set_mig_mode(0, False)  # a write by the daemon keeps the other's process
    assert [p.pid for p in SimulatedNvml(["h200"], state).state.processes] == [55]


def test_a_read_under_the_session_lock_sees_one_state(tmp_path: Path) -> None:
    """What the daemon reads while it holds its NVML lock is one state (the file is checked
    once per hold); another process's change shows at the next hold. From a write on (an
    apply that runs a GPU reset command), the hold sees other processes' changes at once."""
    state = tmp_path / "node.json"
    daemon = NvmlSession(SimulatedNvml(["h200"], state))
    other = SimulatedNvml(["h200"], state)
    with daemon.lock:
        assert read_inventory(daemon).gpus[0].processes == ()
        other.attach("0", 55, 1024 * 1024 * 1024)
        assert read_inventory(daemon).gpus[0].processes == ()
        MigWriter(daemon).set_mig_mode(0, False)  # a write reads the file first
        assert [p.pid for p in read_inventory(daemon).gpus[0].processes] == [55]
        other.attach("0", 56, 1024 * 1024 * 1024)
        assert [p.pid for p in read_inventory(daemon).gpus[0].processes] == [55, 56]
    assert [p.pid for p in read_inventory(daemon).gpus[0].processes] == [55, 56]
    assert [p.pid for p in SimulatedNvml(["h200"], state).state.processes] == [55, 56]


def test_another_thread_reads_after_a_hold_ends_and_sees_the_file_again(tmp_path: Path) -> None:
    """A hold of the NVML lock serialises every call: a call of another thread waits for
    it to end (calls inside the hold skip taking the lock again) and is a new hold, which
    reads another process's change made meanwhile."""
    state = tmp_path / "node.json"
    daemon = NvmlSession(SimulatedNvml(["h200"], state))
    other = SimulatedNvml(["h200"], state)
    seen: list[list[int]] = []
    gpu = daemon.call("nvmlDeviceGetHandleByIndex", 0)

    def read() -> None:  # one call, no hold of its own around it
        seen.append([p.pid for p in daemon.call("nvmlDeviceGetComputeRunningProcesses", gpu)])

    reader = threading.Thread(target=read)
    with daemon.lock:
        assert read_inventory(daemon).gpus[0].processes == ()
        reader.start()
        reader.join(0.05)  # a chance to run: it must wait for this hold
        other.attach("0", 55, 1024 * 1024 * 1024)
        assert read_inventory(daemon).gpus[0].processes == ()
        assert not seen
    reader.join(10)
    assert seen == [[55]]


def test_state_file_is_written_atomically(tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    SimulatedNvml(["h200", "h200"], state)
    assert json.loads(state.read_text())["version"] == 1
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".node.json.")]
    assert leftovers == []
