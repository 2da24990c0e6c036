"""`nodeagent mig ...` as a user runs it: flags, output formats, exit codes, unchanged state."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]


@pytest.fixture
def node(tmp_path: Path, cli: Cli, cli_process: Cli) -> Callable[..., Result]:
    """Run nodeagent on one emulated node (h200x2 unless spec is given), state in tmp_path;
    in this process, or with process=True in a subprocess of its own."""
    state = tmp_path / "node.json"

    def run(*args: str, spec: str = "h200x2", process: bool = False, **kw: object) -> Result:
        runner = cli_process if process else cli
        return runner("--simulate", spec, "--sim-state", str(state), *args, **kw)  # type: ignore[arg-type]

    run.state = state  # type: ignore[attr-defined]
    return run


def _generated(node: Callable[..., Result], tmp_path: Path, spec: str = "h200x2") -> Path:
    res = node("mig", "generate-config", spec=spec)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "configs.yaml"
    path.write_text(res.stdout)
    return path


def test_generate_config_names_match_mig_parted(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    data = yaml.safe_load(_generated(node, tmp_path).read_text())
    assert data["version"] == "v1"
    assert set(data["mig-configs"]) == {
        "all-disabled",
        "all-enabled",
        "all-balanced",
        "all-1g.18gb",
        "all-1g.18gb.me",
        "all-1g.35gb",
        "all-2g.35gb",
        "all-3g.71gb",
        "all-4g.71gb",
        "all-7g.141gb",
    }
    assert data["mig-configs"]["all-1g.18gb"] == [
        {
            "device-filter": "0x233510DE",
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.18gb": 7},
        }
    ]
    assert data["mig-configs"]["all-balanced"][0]["mig-devices"] == {
        "1g.18gb": 2,
        "2g.35gb": 1,
        "3g.71gb": 1,
    }


def test_generate_config_on_a_mixed_node(node: Callable[..., Result], tmp_path: Path) -> None:
    data = yaml.safe_load(_generated(node, tmp_path, "a100-40gbx2,h100-80gb,a30").read_text())[
        "mig-configs"
    ]
    assert [e["device-filter"] for e in data["all-balanced"]] == [
        "0x20B010DE",
        "0x233010DE",
        "0x20B710DE",
    ]
    assert data["all-balanced"][2]["mig-devices"] == {"1g.6gb": 2, "2g.12gb": 1}
    assert data["all-1g.5gb"][0]["mig-devices"] == {"1g.5gb": 7}
    assert len(data["all-1g.10gb"]) == 2  # A100-40GB's 1g.10gb and H100's 1g.10gb


def test_dry_run_json_changes_nothing(node: Callable[..., Result], tmp_path: Path) -> None:
    cfg = _generated(node, tmp_path)
    before = node.state.read_bytes()  # type: ignore[attr-defined]
    res = node("mig", "apply", "-f", str(cfg), "-c", "all-3g.71gb", "--dry-run", "--output", "json")
    assert res.returncode == 0, res.stderr
    ops = json.loads(res.stdout)["operations"]
    assert ops[:3] == [
        {"op": "set-mig-mode", "gpu": 0, "enabled": True},
        {"op": "create-gi", "gpu": 0, "profile": "3g.71gb", "placement": {"start": 0, "size": 4}},
        {"op": "create-gi", "gpu": 0, "profile": "3g.71gb", "placement": {"start": 4, "size": 4}},
    ]
    assert ops[3] == {
        "op": "create-ci",
        "gpu": 0,
        "profile": "3g.71gb",
        "placement": {"start": 0, "size": 4},
        "compute_slices": 3,
        "ci_start": 0,
    }
    assert len(ops) == 10 and node.state.read_bytes() == before  # type: ignore[attr-defined]


def test_apply_assert_export_round_trip(node: Callable[..., Result], tmp_path: Path) -> None:
    cfg = str(_generated(node, tmp_path))
    assert node("mig", "assert", "-f", cfg, "-c", "all-balanced").returncode == 1
    res = node("mig", "apply", "-f", cfg, "-c", "all-balanced", "-o", "json")
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout)["operations"]
    creates = [op for op in done if op["op"] == "create-ci"]
    assert all("gi_id" in op and "ci_id" in op for op in creates) and len(creates) == 8
    res = node("mig", "assert", "-f", cfg, "-c", "all-balanced")
    assert res.returncode == 0 and "match" in res.stdout
    res = node("mig", "assert", "-f", cfg, "-c", "all-1g.18gb")
    assert res.returncode == 1 and "wanted 7x1g.18gb" in res.stdout
    export = node("mig", "export")
    assert export.returncode == 0
    (tmp_path / "current.yaml").write_text(export.stdout)
    res = node("mig", "apply", "-f", str(tmp_path / "current.yaml"), "-c", "current")
    assert res.returncode == 0 and "nothing to change" in res.stdout


def test_stdin_and_environment(node: Callable[..., Result], tmp_path: Path) -> None:
    text = _generated(node, tmp_path).read_text()
    res = node("mig", "apply", "-f", "-", "-c", "all-7g.141gb", stdin=text)
    assert res.returncode == 0, res.stderr
    env = {
        "NODEAGENT_MIG_CONFIG_FILE": str(tmp_path / "configs.yaml"),
        "NODEAGENT_MIG_CONFIG": "all-7g.141gb",
    }
    assert node("mig", "assert", env=env).returncode == 0


NODE_BAD = [
    (
        "unknown-profile",
        "- devices: all\n  mig-enabled: true\n  mig-devices: {1g.5gb: 2}",
        ("bad.yaml:6:21", "GPUs 0, 1 (NVIDIA H200) have no MIG profile 1g.5gb", "valid: 1g.18gb"),
    ),
    (
        "over-capacity",
        "- devices: [1]\n  mig-enabled: true\n  mig-devices: {3g.71gb: 3}",
        ("bad.yaml:6:21", "GPU 1 (NVIDIA H200) holds at most 2x3g.71gb; asked for 3"),
    ),
    (
        "no-valid-placement",
        "- devices: [0]\n  mig-enabled: true\n  mig-devices: {4g.71gb: 1, 3g.71gb: 1, 1g.18gb: 1}",
        ("bad.yaml:4:7", "do not fit together on GPU 0"),
    ),
    (
        "two-me",
        "- devices: [0]\n  mig-enabled: true\n  mig-devices: {1g.18gb+me: 2}",
        ("at most 1x1g.18gb+me",),
    ),
    (
        "matched-twice",
        "- devices: all\n  mig-enabled: false\n- devices: [1]\n  mig-enabled: true\n  mig-devices: {}",
        ("bad.yaml:6:7", "GPU 1 is already configured", "bad.yaml:4:7"),
    ),
]


@pytest.mark.parametrize(("body", "words"), [c[1:] for c in NODE_BAD], ids=[c[0] for c in NODE_BAD])
def test_config_wrong_for_this_node(
    node: Callable[..., Result], tmp_path: Path, body: str, words: tuple[str, ...]
) -> None:
    assert node("status").returncode == 0
    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  x:\n"
        + "\n".join("    " + line for line in body.splitlines())
        + "\n"
    )
    before = node.state.read_bytes()  # type: ignore[attr-defined]
    assert_one_error(node("mig", "apply", "-f", str(path), "-c", "x"), 2, *words)
    assert node.state.read_bytes() == before  # type: ignore[attr-defined]


def test_parse_errors_exit_2_and_change_nothing(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    assert node("status").returncode == 0
    before = node.state.read_bytes()  # type: ignore[attr-defined]
    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: nope\n"
    )
    assert_one_error(
        node("mig", "apply", "-f", str(path), "-c", "x"), 2, "bad.yaml:5:20", "mig-enabled"
    )
    assert_one_error(
        node("mig", "apply", "-f", str(path) + ".missing", "-c", "x"),
        2,
        "cannot read",
        "No such file",
    )
    # No -f: the configs generated from the GPUs (as mig-manager), which name no 'x'.
    assert_one_error(node("mig", "apply", "-c", "x"), 2, "generated", "no config named 'x'")
    assert_one_error(node("mig", "apply"), 2, "-c NAME", "-f FILE")
    assert_one_error(node("mig", "apply", "-f", str(_generated(node, tmp_path))), 2, "-c NAME")
    assert_one_error(
        node("mig", "apply", "-f", str(tmp_path / "configs.yaml"), "-c", "all-5g"),
        2,
        "no config named 'all-5g'",
    )
    assert node.state.read_bytes() == before  # type: ignore[attr-defined]


def test_in_use_refusal_exits_3_and_changes_nothing(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    cfg = str(_generated(node, tmp_path))
    assert node("mig", "apply", "-f", cfg, "-c", "all-balanced").returncode == 0
    slices = json.loads(node("status", "-o", "json").stdout)["gpus"][1]["slices"]
    uuid = next(s["mig_uuid"] for s in slices if s["profile"] == "3g.71gb")
    assert node("sim", "attach", "--device", uuid, "--pid", "777").returncode == 0
    before = node.state.read_bytes()  # type: ignore[attr-defined]
    assert_one_error(
        node("mig", "apply", "-f", cfg, "-c", "all-1g.18gb"),
        3,
        "GPU 1",
        uuid,
        "pid 777",
        "nothing was changed",
    )
    assert node.state.read_bytes() == before  # type: ignore[attr-defined]


def test_nothing_matched_exits_1(node: Callable[..., Result], tmp_path: Path) -> None:
    path = tmp_path / "a30.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  x:\n    - devices: all\n      device-filter: '0x20B710DE'\n      mig-enabled: false\n"
    )
    assert_one_error(node("mig", "apply", "-f", str(path), "-c", "x"), 1, "matches no GPU")


def test_killed_apply_converges_on_the_next_run(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    cfg = str(_generated(node, tmp_path))
    faults = json.dumps(
        [{"mutation": 4, "exit": 137, "when": "after"}]
    )  # after GPU 0's 3rd create-gi
    # A process of its own: the fault ends it with os._exit, as a kill would.
    res = node(
        "mig",
        "apply",
        "-f",
        cfg,
        "-c",
        "all-balanced",
        env={"NODEAGENT_SIM_FAULTS": faults},
        process=True,
    )
    assert res.returncode == 137
    status = json.loads(node("status", "-o", "json").stdout)
    assert [s["ci_id"] for s in status["gpus"][0]["slices"]] == [
        None,
        None,
        None,
    ]  # GIs without CIs
    res = node("mig", "apply", "-f", cfg, "-c", "all-balanced", "-o", "json")
    assert res.returncode == 0, res.stderr
    ops = [op["op"] for op in json.loads(res.stdout)["operations"] if op["gpu"] == 0]
    assert ops == [
        "create-gi",
        "create-ci",
        "create-ci",
        "create-ci",
        "create-ci",
    ]  # finished, not rebuilt
    assert node("mig", "assert", "-f", cfg, "-c", "all-balanced").returncode == 0


def test_ampere_reset_command(node: Callable[..., Result], tmp_path: Path) -> None:
    cfg = str(_generated(node, tmp_path, "a100-40gbx2"))
    res = node(
        "mig",
        "apply",
        "-f",
        cfg,
        "-c",
        "all-3g.20gb",
        "--reset-command",
        "false",
        spec="a100-40gbx2",
    )
    # The reset failed: the mode waits for a reboot (exit 5), on every GPU it was set on.
    assert_one_error(res, 5, "GPUs 0, 1", "pending until the node reboots", "'false' failed")
    reset = f"{sys.executable} -m nodeagent --simulate a100-40gbx2 --sim-state {node.state} sim reset --gpu {{index}}"  # type: ignore[attr-defined]
    res = node(
        "mig",
        "apply",
        "-f",
        cfg,
        "-c",
        "all-3g.20gb",
        "--reset-command",
        reset,
        "-o",
        "json",
        spec="a100-40gbx2",
    )
    assert res.returncode == 0, res.stderr
    modes = [op for op in json.loads(res.stdout)["operations"] if op["op"] == "set-mig-mode"]
    assert modes == [
        {"op": "set-mig-mode", "gpu": 0, "enabled": True, "reset": True},
        {"op": "set-mig-mode", "gpu": 1, "enabled": True, "reset": True},
    ]
    assert node("mig", "assert", "-f", cfg, "-c", "all-3g.20gb", spec="a100-40gbx2").returncode == 0


def test_mig_parted_node_semantics(node: Callable[..., Result], tmp_path: Path) -> None:
    """As mig-parted: a file of one config needs no -c; indices beyond the node are skipped
    (a config written for 8 GPUs works on 2); a device-filter may name the board's subsystem
    id too; `assert` fails while a GPU of the node is left unspecified."""
    one = tmp_path / "one.yaml"
    one.write_text(
        "version: v1\nmig-configs:\n  eight-gpus:\n"
        "    - devices: [0, 1, 2, 3, 4, 5, 6, 7]\n"
        "      device-filter: ['0x233510DE:0x18C810DE']\n"
        "      mig-enabled: true\n      mig-devices: {'3g.71gb': 2}\n"
    )
    res = node("mig", "apply", "-f", str(one))
    assert res.returncode == 0, res.stderr
    assert "GPU 2 does not exist" in res.stderr and "skipped" in res.stderr
    assert node("mig", "assert", "-f", str(one)).returncode == 0
    first = tmp_path / "first.yaml"
    first.write_text(
        "version: v1\nmig-configs:\n  first:\n    - devices: [0]\n"
        "      mig-enabled: true\n      mig-devices: {'3g.71gb': 2}\n"
    )
    res = node("mig", "assert", "-f", str(first))
    assert (
        res.returncode == 1
        and "GPU 1 (NVIDIA H200): config 'first' does not specify it" in res.stdout
    )
    other_board = tmp_path / "other.yaml"
    other_board.write_text(one.read_text().replace("0x18C810DE", "0x18C910DE"))
    assert_one_error(node("mig", "apply", "-f", str(other_board)), 1, "matches no GPU")
    two = tmp_path / "two.yaml"
    two.write_text(
        first.read_text()
        + "  second:\n    - devices: all\n      mig-enabled: false\n      mig-devices: {}\n"
    )
    assert_one_error(node("mig", "apply", "-f", str(two)), 2, "defines 2 configs (first, second)")


def test_a_no_op_apply_reads_the_gpus_once(node: Callable[..., Result], tmp_path: Path) -> None:
    """The config already applied: one read of the GPUs, no verify read after the empty plan
    (a second nvmlDeviceGetCount would fail); a real change does read them again."""
    cfg = str(_generated(node, tmp_path))
    assert node("mig", "apply", "-f", cfg, "-c", "all-1g.18gb").returncode == 0
    second_read_fails = {
        "NODEAGENT_SIM_FAULTS": json.dumps(
            [{"function": "nvmlDeviceGetCount", "call": 2, "error": "NVML_ERROR_UNKNOWN"}]
        )
    }
    res = node("mig", "apply", "-f", cfg, "-c", "all-1g.18gb", env=second_read_fails)
    assert res.returncode == 0, res.stderr
    res = node("mig", "apply", "-f", cfg, "-c", "all-disabled", env=second_read_fails)
    assert_one_error(res, 3, "nvmlDeviceGetCount")
