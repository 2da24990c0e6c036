"""`nodeagent status` and the emulator commands, run as a user runs them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.sim.models import load_model
from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]


def test_done_when_two_h200_with_the_fixture_profiles(cli: Cli, shared_fixtures: Path) -> None:
    res = cli("--simulate", "h200x2", "status", "--output", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    fixture = json.loads((shared_fixtures / "nvml" / "h200-sxm-141gb.json").read_text())
    want = {
        p["id"]: (
            p["name"].removeprefix("MIG "),
            p["multiprocessorCount"],
            p["memorySizeMB"],
            p["placements"],
        )
        for p in fixture["gpu_instance_profiles"]
    }
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    for gpu in data["gpus"]:
        got = {
            p["id"]: (
                p["name"],
                p["multiprocessor_count"],
                p["memory_bytes"] // (1024 * 1024),
                [[q["start"], q["size"]] for q in p["placements"]],
            )
            for p in gpu["profiles"]
        }
        assert got == want


def test_text_status_draws_the_slices(cli: Cli, tmp_path: Path) -> None:
    state = str(tmp_path / "node.json")
    base = ("--simulate", "h200", "--sim-state", state)
    # Build a layout through NVML in-process, persisted to the state file.
    from nodeagent.nvml import MigWriter, NvmlSession, Placement
    from nodeagent.sim import SimulatedNvml

    session = NvmlSession(SimulatedNvml(["h200"], Path(state)))
    w = MigWriter(session)
    w.set_mig_mode(0, True)
    for pid, start, size, slices in [(9, 0, 4, 3), (14, 4, 2, 2), (19, 6, 1, 1)]:
        w.create_compute_instance(0, w.create_gpu_instance(0, pid, Placement(start, size)), slices)
    session.close()
    status = cli(*base, "status", "-o", "json")
    mig_uuid = json.loads(status.stdout)["gpus"][0]["slices"][0]["mig_uuid"]
    assert (
        cli(
            *base, "sim", "attach", "--device", mig_uuid, "--pid", "321", "--memory-mib", "2048"
        ).returncode
        == 0
    )
    res = cli(*base, "status")
    assert res.returncode == 0, res.stderr
    assert "MIG     enabled" in res.stdout
    assert "| 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |" in res.stdout
    assert "| A | A | A | A | B | B | C | . |" in res.stdout
    row = next(line for line in res.stdout.splitlines() if line.strip().startswith("A  "))
    assert "3g.71gb" in row and "0:4" in row and mig_uuid in row and "321 (2.0 GiB)" in row


def test_state_persists_across_invocations(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    base = ("--simulate", "h200x2", "--sim-state", str(state))
    assert (
        cli(*base, "sim", "attach", "--device", "1", "--pid", "9", "--memory-mib", "512").returncode
        == 0
    )
    data = json.loads(cli(*base, "status", "-o", "json").stdout)
    assert data["gpus"][1]["processes"] == [{"pid": 9, "memory_bytes": 512 * 1024 * 1024}]
    uuid = data["gpus"][0]["uuid"]
    assert cli(*base, "sim", "attach", "--device", uuid, "--pid", "10").returncode == 0
    assert cli(*base, "sim", "detach", "--pid", "9").returncode == 0
    data = json.loads(cli(*base, "status", "-o", "json").stdout)
    assert [p["pid"] for p in data["gpus"][0]["processes"]] == [10]
    assert data["gpus"][1]["processes"] == []


def test_environment_variables_select_the_emulator(cli: Cli, tmp_path: Path) -> None:
    env = {"NODEAGENT_SIMULATE": "a30", "NODEAGENT_SIM_STATE": str(tmp_path / "s.json")}
    res = cli("status", "-o", "json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["gpus"][0]["name"] == load_model("a30").name
    assert (tmp_path / "s.json").exists()


def test_unknown_spec_is_bad_input(cli: Cli) -> None:
    assert_one_error(cli("--simulate", "v100x2", "status"), 2, "v100x2", "known models")


def test_corrupt_state_file_is_bad_input_and_untouched(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    state.write_text('{"version": 1, "gpus": [')
    before = state.read_bytes()
    assert_one_error(
        cli("--simulate", "h200", "--sim-state", str(state), "status"), 2, str(state), "corrupt"
    )
    assert state.read_bytes() == before
    state.write_text('{"version": 1, "gpus": [{"index": 0}], "processes": []}')
    before = state.read_bytes()
    assert_one_error(
        cli("--simulate", "h200", "--sim-state", str(state), "sim", "detach", "--pid", "1"),
        2,
        "corrupt",
    )
    assert state.read_bytes() == before


def test_state_file_of_another_node_is_refused(cli: Cli, tmp_path: Path) -> None:
    state = str(tmp_path / "node.json")
    assert cli("--simulate", "h200x2", "--sim-state", state, "status").returncode == 0
    before = Path(state).read_bytes()
    assert_one_error(cli("--simulate", "h200x8", "--sim-state", state, "status"), 2, "h200,h200")
    assert Path(state).read_bytes() == before


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("sim", "attach", "--device", "7", "--pid", "1"), ("GPU 7 does not exist",)),
        (("sim", "attach", "--device", "MIG-nope", "--pid", "1"), ("MIG-nope",)),
        (("sim", "attach", "--device", "0", "--pid", "1", "--memory-mib", "999999"), ("MiB free",)),
        (("sim", "attach", "--device", "0", "--pid", "-3"), ("--pid",)),
        (("sim", "reset", "--gpu", "4"), ("GPU 4 does not exist",)),
    ],
)
def test_bad_device_or_values_are_bad_input(
    cli: Cli, tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    state = tmp_path / "node.json"
    assert cli("--simulate", "h200x2", "--sim-state", str(state), "status").returncode == 0
    before = state.read_bytes()
    assert_one_error(cli("--simulate", "h200x2", "--sim-state", str(state), *args), 2, *words)
    assert state.read_bytes() == before


def test_sim_commands_need_the_emulator_and_a_state_file(cli: Cli) -> None:
    assert_one_error(cli("sim", "detach", "--pid", "1"), 2, "--simulate")
    assert_one_error(cli("--simulate", "h200", "sim", "detach", "--pid", "1"), 2, "--sim-state")


def test_attach_to_a_mig_gpu_needs_a_mig_device(cli: Cli, tmp_path: Path) -> None:
    from nodeagent.nvml import MigWriter, NvmlSession
    from nodeagent.sim import SimulatedNvml

    state = tmp_path / "node.json"
    session = NvmlSession(SimulatedNvml(["h200"], state))
    MigWriter(session).set_mig_mode(0, True)
    session.close()
    assert_one_error(
        cli(
            "--simulate",
            "h200",
            "--sim-state",
            str(state),
            "sim",
            "attach",
            "--device",
            "0",
            "--pid",
            "5",
        ),
        2,
        "MIG enabled",
    )


def test_bad_flag_exits_2(cli: Cli) -> None:
    res = cli("--simulate", "h200", "status", "--output", "yaml")
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_no_nvml_library_is_a_clear_error(cli: Cli) -> None:
    """On this CPU machine the real NVML is absent: one sentence, exit 3, a hint."""
    res = cli("status")
    if res.returncode == 0:
        pytest.skip("a real NVML is present on this machine")
    assert_one_error(res, 3, "nvmlInit")
