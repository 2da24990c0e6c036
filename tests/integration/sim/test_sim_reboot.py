"""The emulator's GPUs without a GPU reset (spec suffix `:no-reset`, a pass-through VM: NVML's
nvmlDeviceSetMigMode docs say a VM reboot is needed there) and its reboot: what survives it."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from nodeagent.base.errors import NvmlError, SimError
from nodeagent.nvml import MigWriter, NvmlSession, Placement, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec


def _modes(lib: SimulatedNvml) -> list[tuple[int, int]]:
    return [(g.mig_current, g.mig_pending) for g in lib.state.gpus]


@pytest.mark.parametrize(
    ("spec", "keys"),
    [
        ("a100-40gb:no-reset", ["a100-40gb:no-reset"]),
        ("a100-40gbx2:no-reset,h200", ["a100-40gb:no-reset"] * 2 + ["h200"]),
        ("A30X2:NO-RESET", ["a30:no-reset"] * 2),
    ],
)
def test_the_suffix_is_part_of_the_spec(spec: str, keys: list[str]) -> None:
    assert parse_spec(spec) == keys
    lib = SimulatedNvml(keys)
    assert lib.state.models == keys
    assert [g.reset_refused for g in lib.state.gpus] == [k.endswith(":no-reset") for k in keys]


@pytest.mark.parametrize("spec", ["a100-40gb:reset", "a100-40gb:no-resetx2", ":no-reset"])
def test_bad_suffixes_are_refused(spec: str) -> None:
    with pytest.raises(SimError, match="no-reset"):
        parse_spec(spec)


def test_an_ampere_mode_without_a_reset_waits_for_the_reboot() -> None:
    lib = SimulatedNvml(parse_spec("a100-40gbx2:no-reset"))
    writer = MigWriter(NvmlSession(lib))
    result = writer.set_mig_mode(0, True)
    assert result.activation_status == pynvml.NVML_ERROR_RESET_REQUIRED
    with pytest.raises(NvmlError) as err:
        lib.reset(0)
    assert err.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert _modes(lib) == [(0, 1), (0, 0)]
    lib.attach("1", 41, 1 << 30)
    lib.reboot()
    assert _modes(lib) == [(1, 1), (0, 0)]
    assert lib.state.processes == []


def test_a_reboot_ends_instances_and_processes_and_hopper_forgets_its_mode() -> None:
    lib = SimulatedNvml(parse_spec("a100-40gb,h200"))
    session = NvmlSession(lib)
    writer = MigWriter(session)
    for index in (0, 1):
        writer.set_mig_mode(index, True)
    lib.reset(0)  # the A100's reset works here
    for gpu in read_inventory(session).gpus:
        seven = next(p for p in gpu.profiles if p.slice_count == 7)
        writer.create_gpu_instance(gpu.index, seven.id, Placement(0, 8))
    assert [len(g.gis) for g in lib.state.gpus] == [1, 1]
    lib.reboot()
    assert [len(g.gis) for g in lib.state.gpus] == [0, 0]
    assert _modes(lib) == [(1, 1), (0, 0)]  # Ampere keeps its mode; Hopper does not


def test_the_state_file_keeps_the_kind(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    SimulatedNvml(parse_spec("a100-40gb:no-reset"), path)
    again = SimulatedNvml(parse_spec("a100-40gb:no-reset"), path)
    assert again.state.gpus[0].reset_refused
    with pytest.raises(SimError, match="a100-40gb:no-reset"):
        SimulatedNvml(parse_spec("a100-40gb"), path)  # another kind of node: refused
    raw = json.loads(path.read_text())
    raw["gpus"][0]["reset_refused"] = "yes"
    path.write_text(json.dumps(raw))
    with pytest.raises(SimError, match=r"gpus\[0\]\.reset_refused must be true or false"):
        SimulatedNvml(parse_spec("a100-40gb:no-reset"), path)
