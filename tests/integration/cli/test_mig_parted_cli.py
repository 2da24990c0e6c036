"""`nvidia-mig-parted` (nodeagent's mig-parted command line) and `nodeagent mig` take the same
command lines, flags and MIG_PARTED_* variables as mig-parted (cmd/nvidia-mig-parted at
bd7160f) and leave the GPUs the same; the entry point answers with mig-parted's exit codes
(0, else 1) and success lines, `nodeagent mig` with nodeagent's (0, 1 false, 2 bad input).

The config file is mig-parted's own examples/config.yaml (tests/fixtures/upstream/README.md).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nodeagent import __version__
from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]
UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/upstream/mig-parted"
CONFIG = str(UPSTREAM / "examples/config.yaml")
SPEC = "a100-40gbx2"  # examples/config.yaml names A100-40GB profiles
BALANCED = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def _geometry(cli: Cli, state: Path) -> list[tuple[bool, dict[str, int]]]:
    """Each GPU's MIG mode and MIG devices, as `mig export -o json` reports them."""
    res = cli("mig", "export", "-o", "json", env=_env(state))
    assert res.returncode == 0, res.stderr
    out: dict[int, tuple[bool, dict[str, int]]] = {}
    for entry in json.loads(res.stdout)["mig-configs"]["current"]:
        for index in entry["devices"]:
            out[index] = (entry["mig-enabled"], entry.get("mig-devices", {}))
    return [out[i] for i in sorted(out)]


def _env(state: Path, **extra: str) -> dict[str, str]:
    return {"NODEAGENT_SIMULATE": SPEC, "NODEAGENT_SIM_STATE": str(state), **extra}


OFF = (False, {})
ON = (True, {})
# setup: config applied first (or None); the command line after `nodeagent mig` and after
# `nvidia-mig-parted`; MIG_PARTED_* variables; nodeagent's and mig-parted's exit code; each
# GPU's resulting geometry (None: as before the command)
CASES = [
    (None, ["apply", "-f", CONFIG, "-c", "all-1g.5gb"], {}, 0, 0, (True, {"1g.5gb": 7})),
    (None, ["apply", "--config-file", CONFIG, "--selected-config", "all-balanced", "-d"], {}, 0, 0, (True, BALANCED)),
    (None, ["apply"], {"MIG_PARTED_CONFIG_FILE": CONFIG, "MIG_PARTED_SELECTED_CONFIG": "all-2g.10gb"}, 0, 0, (True, {"2g.10gb": 3})),
    (None, ["apply", "-f", CONFIG, "-c", "all-1g.5gb", "-m"], {}, 0, 0, ON),
    (None, ["apply", "-f", CONFIG, "-c", "all-1g.5gb"], {"MIG_PARTED_MODE_CHANGE_ONLY": "true"}, 0, 0, ON),
    ("all-balanced", ["apply", "--mode-only", "-f", CONFIG, "-c", "all-1g.5gb"], {}, 0, 0, None),
    ("all-balanced", ["apply", "-m", "-f", CONFIG, "-c", "all-disabled"], {}, 0, 0, OFF),
    # Ampere: enabling MIG needs a reset, which --skip-reset leaves to the user (exit 3)
    (None, ["apply", "-s", "-f", CONFIG, "-c", "all-3g.20gb"], {}, 3, 1, None),
    (None, ["apply", "-f", CONFIG, "-c", "all-3g.20gb"], {"MIG_PARTED_SKIP_RESET": "true"}, 3, 1, None),
    (None, ["apply", "-f", CONFIG, "-c", "no-such-config"], {}, 2, 1, None),
    (None, ["apply", "-f", CONFIG], {}, 2, 1, None),
    (None, ["apply"], {}, 2, 1, None),  # neither -f nor -c (-c alone: generated configs, below)
    (None, ["apply", "-f", CONFIG, "-c", "all-1g.5gb", "--no-such-flag"], {}, 2, 1, None),
    (None, ["apply", "-f", CONFIG, "-c", "all-1g.5gb"], {"MIG_PARTED_SKIP_RESET": "maybe"}, 2, 1, None),
    (None, ["assert", "-f", CONFIG, "-c", "all-disabled"], {}, 0, 0, None),
    ("all-balanced", ["assert", "-f", CONFIG, "-c", "all-balanced", "-d"], {}, 0, 0, None),
    ("all-balanced", ["assert", "-f", CONFIG, "-c", "all-1g.5gb"], {}, 1, 1, None),
    ("all-balanced", ["assert", "-m", "-f", CONFIG, "-c", "all-1g.5gb"], {}, 0, 0, None),
    ("all-balanced", ["assert", "-f", CONFIG, "-c", "all-1g.5gb"], {"MIG_PARTED_MODE_CHANGE_ONLY": "1"}, 0, 0, None),
    ("all-balanced", ["assert", "--mode-only", "-f", CONFIG, "-c", "all-disabled"], {}, 1, 1, None),
    (None, ["assert", "-a", "-f", CONFIG, "-c", "all-1g.5gb"], {}, 0, 0, None),
    (None, ["assert", "--valid-config"], {"MIG_PARTED_CONFIG_FILE": CONFIG, "MIG_PARTED_SELECTED_CONFIG": "nope"}, 2, 1, None),
    (None, ["assert", "-f", CONFIG, "-c", "all-1g.5gb"], {"MIG_PARTED_VALID_CONFIG": "t"}, 0, 0, None),
    (None, ["export", "-o", "xml"], {}, 2, 1, None),
    (None, ["export"], {"MIG_PARTED_OUTPUT_FORMAT": "toml"}, 2, 1, None),
    (None, ["export"], {"MIG_PARTED_DEBUG": "yes"}, 2, 1, None),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "line", "variables", "nodeagent", "parted", "after"), CASES)
def test_the_same_command_line_does_the_same_on_both(
    cli: Cli,
    mig_parted: Cli,
    tmp_path: Path,
    setup: str | None,
    line: list[str],
    variables: dict[str, str],
    nodeagent: int,
    parted: int,
    after: tuple[bool, dict[str, int]] | None,
) -> None:
    states = {"nodeagent": tmp_path / "a.json", "parted": tmp_path / "b.json"}
    if setup:
        assert (
            cli("mig", "apply", "-f", CONFIG, "-c", setup, env=_env(states["parted"])).returncode
            == 0
        )
        shutil.copyfile(states["parted"], states["nodeagent"])
    before = _geometry(cli, states["nodeagent"]) if after is None else None
    ours = cli("mig", *line, env=_env(states["nodeagent"], **variables))
    theirs = mig_parted(*line, env=_env(states["parted"], **variables))
    assert (ours.returncode, theirs.returncode) == (nodeagent, parted), (ours, theirs)
    assert "Traceback" not in ours.stderr + theirs.stderr
    assert ours.returncode < 2 or ours.stderr.strip()  # an error says why; assert's 1 on stdout
    assert theirs.returncode == 0 or theirs.stderr.strip()  # every failure says why
    geometry = _geometry(cli, states["nodeagent"])
    assert geometry == _geometry(cli, states["parted"])
    assert geometry == (before if after is None else [after, after])


def test_mig_parteds_success_lines_and_failure_sentence(mig_parted: Cli, tmp_path: Path) -> None:
    env = _env(tmp_path / "node.json")
    res = mig_parted("apply", "-f", CONFIG, "-c", "all-balanced", env=env)
    assert (res.returncode, res.stdout) == (0, "MIG configuration applied successfully\n")
    for line, said in [
        (["assert", "-f", CONFIG, "-c", "all-balanced"], "Selected MIG configuration currently applied"),
        (["assert", "-m", "-f", CONFIG, "-c", "all-2g.10gb"], "Selected MIG mode settings from configuration currently applied"),
        (["assert", "-a", "-f", CONFIG, "-c", "all-2g.10gb"], "Selected MIG configuration is valid"),
    ]:  # fmt: skip
        res = mig_parted(*line, env=env)
        assert (res.returncode, res.stdout, res.stderr) == (0, said + "\n", "")
    res = mig_parted("assert", "-f", CONFIG, "-c", "all-2g.10gb", env=env)
    assert res.stdout == ""
    assert_one_error(res, 1, "Assertion failure: selected configuration not currently applied")
    res = mig_parted("-d", "assert", "-f", CONFIG, "-c", "all-2g.10gb", env=env)
    assert "GPU 0: has 2x1g.5gb + 1x2g.10gb + 1x3g.20gb, wanted 3x2g.10gb" in res.stderr  # as -d
    assert '"level": "debug"' in res.stderr  # debug logging
    res = mig_parted("apply", "-f", CONFIG, "-c", "nope", env=env)
    assert_one_error(res, 1, "nvidia-mig-parted: ", "no config named 'nope'")


def test_export_formats_and_label(cli: Cli, mig_parted: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    assert cli("mig", "apply", "-f", CONFIG, "-c", "all-balanced", env=_env(state)).returncode == 0
    ours = cli("mig", "export", "-o", "json", "-l", "my-config", env=_env(state))
    theirs = mig_parted("export", "-o", "json", "-l", "my-config", env=_env(state))
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout == theirs.stdout
    assert json.loads(ours.stdout) == {
        "version": "v1",
        "mig-configs": {
            "my-config": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": BALANCED}]
        },
    }
    variables = _env(state, MIG_PARTED_OUTPUT_FORMAT="json", MIG_PARTED_CONFIG_LABEL="my-config")
    assert mig_parted("export", env=variables).stdout == ours.stdout
    default = mig_parted("export", env=_env(state))  # yaml, named current, as mig-parted
    assert (
        yaml.safe_load(default.stdout)["mig-configs"]["current"]
        == yaml.safe_load(ours.stdout)["mig-configs"]["my-config"]
    )
    flag_wins = mig_parted("export", "-o", "yaml", "-l", "x", env=variables)
    assert list(yaml.safe_load(flag_wins.stdout)["mig-configs"]) == ["x"]
    exported = tmp_path / "exported.json"  # JSON is YAML: the export applies back unchanged
    exported.write_text(ours.stdout)
    res = mig_parted("apply", "-f", str(exported), "-c", "my-config", env=_env(state))
    assert res.returncode == 0, res.stderr
    assert _geometry(cli, state) == [(True, BALANCED)] * 2


def test_generate_config_to_a_file(mig_parted: Cli, tmp_path: Path) -> None:
    out = tmp_path / "generated.json"
    res = mig_parted("generate-config", "-o", "json", "-f", str(out), env=_env(tmp_path / "s"))
    assert (res.returncode, res.stdout) == (0, "")
    configs = json.loads(out.read_text())["mig-configs"]
    assert configs["all-balanced"][0]["mig-devices"] == BALANCED
    env = _env(tmp_path / "s", MIG_PARTED_OUTPUT_FILE=str(tmp_path / "from-env.yaml"))
    assert mig_parted("generate-config", env=env).returncode == 0
    assert yaml.safe_load((tmp_path / "from-env.yaml").read_text())["mig-configs"] == configs


@pytest.mark.parametrize("line", [["checkpoint", "-f", "state.json"], ["restore", "-f", "state.json", "-k", "hooks.yaml"]])  # fmt: skip
def test_checkpoint_and_restore_are_refused(mig_parted: Cli, line: list[str]) -> None:
    assert_one_error(mig_parted(*line), 2, f"'{line[0]}' is not supported by nodeagent")


def test_version_and_help(mig_parted: Cli) -> None:
    res = mig_parted("--version")
    assert (res.returncode, res.stdout) == (
        0,
        f"nvidia-mig-parted version {__version__} (nodeagent)\n",
    )
    assert mig_parted("-v").stdout == res.stdout
    res = mig_parted("apply", "--help")
    assert res.returncode == 0
    for flag in (
        "--config-file",
        "--selected-config",
        "--hooks-file",
        "--skip-reset",
        "--mode-only",
    ):
        assert flag in res.stdout


def test_the_console_script_is_installed_with_nodeagent() -> None:
    """pyproject.toml names nvidia-mig-parted's entry point, and that is the command tested."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    scripts = tomllib.loads(pyproject.read_text())["project"]["scripts"]
    assert scripts["nvidia-mig-parted"] == "nodeagent.cli.migparted:main"


def test_without_a_file_mig_parted_refuses_and_nodeagent_uses_the_generated_configs(
    cli: Callable[..., Result], mig_parted: Callable[..., Result], tmp_path: Path
) -> None:
    """mig-parted requires -f (its CheckFlags); nodeagent, as mig-manager since v0.14.0, takes
    the configs generated from the GPUs."""
    state = tmp_path / "node.json"
    theirs = mig_parted("apply", "-c", "all-1g.5gb", env=_env(state))
    assert theirs.returncode == 1
    assert "missing required flags 'config-file'" in theirs.stderr
    ours = cli("mig", "apply", "-c", "all-1g.5gb", env=_env(state))
    assert ours.returncode == 0, ours.stderr
