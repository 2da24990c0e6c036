"""`nodeagent mig apply --hooks-file` as mig-parted's `apply --hooks-file`: apply-start and
apply-exit around every apply, pre-apply-mode / pre-apply-config only when needed, a failing
hook before the change changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Result, assert_one_error

NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")


def _files(tmp_path: Path, cli: Callable[..., Result], fail: str | None = None) -> list[str]:
    record = tmp_path / "record"

    def command(name: str) -> dict[str, object]:
        script = f'echo "{name} $MIG_PARTED_SELECTED_CONFIG $NODEAGENT_RESULT" >> {record}'
        if name == fail:
            script += "; echo 'hook says no' >&2; exit 1"
        return {"command": "/bin/sh", "args": ["-c", script]}

    hooks = tmp_path / "hooks.yaml"
    hooks.write_text(yaml.safe_dump({"version": "v1", "hooks": {n: [command(n)] for n in NAMES}}))
    state = tmp_path / "node.json"
    base = ["--simulate", "h200", "--sim-state", str(state)]
    generated = cli(*base, "mig", "generate-config")
    (tmp_path / "mig.yaml").write_text(generated.stdout)
    return [*base, "mig", "apply", "-f", str(tmp_path / "mig.yaml"), "--hooks-file", str(hooks)]


def _record(tmp_path: Path) -> list[str]:
    path = tmp_path / "record"
    return [line.rstrip() for line in path.read_text().splitlines()] if path.exists() else []


def test_hooks_run_around_a_change_and_around_nothing(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    apply = _files(tmp_path, cli)
    res = cli(*apply, "-c", "all-balanced")
    assert res.returncode == 0, res.stderr
    assert _record(tmp_path) == [
        "apply-start all-balanced",
        "pre-apply-mode all-balanced",
        "pre-apply-config all-balanced",
        "apply-exit all-balanced success",
    ]
    (tmp_path / "record").unlink()
    res = cli(*apply, "-c", "all-balanced")  # already applied: only start and exit, as upstream
    assert res.returncode == 0, res.stderr
    assert _record(tmp_path) == ["apply-start all-balanced", "apply-exit all-balanced success"]
    (tmp_path / "record").unlink()
    assert cli(*apply, "-c", "all-balanced", "--dry-run").returncode == 0
    assert _record(tmp_path) == []  # a dry run runs no hook


def test_a_failing_pre_apply_hook_changes_nothing(
    tmp_path: Path, cli: Callable[..., Result]
) -> None:
    apply = _files(tmp_path, cli, fail="pre-apply-mode")
    assert_one_error(cli(*apply, "-c", "all-balanced"), 3, "hook pre-apply-mode[0]", "hook says no")
    assert _record(tmp_path)[-1] == "apply-exit all-balanced failure"
    state = cli("--simulate", "h200", "--sim-state", str(tmp_path / "node.json"), "mig", "export")
    assert "mig-enabled: false" in state.stdout


def test_a_bad_hooks_file_is_exit_2(tmp_path: Path, cli: Callable[..., Result]) -> None:
    apply = _files(tmp_path, cli)
    (tmp_path / "hooks.yaml").write_text("version: v1\nhooks: {apply-begin: []}\n")
    assert_one_error(cli(*apply, "-c", "all-balanced"), 2, "hooks.yaml:2:9", "unknown hook")
    assert _record(tmp_path) == []


UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/upstream/mig-parted"
# A stand-in for the hooks.sh of mig-parted's systemd mig-manager: each function records its
# name, its arguments and what mig-parted's apply tells its hooks.
HOOKS_SH = """
record() {
  echo "$* config=$MIG_PARTED_SELECTED_CONFIG file=${MIG_PARTED_CONFIG_FILE##*/}\
 hooks=${MIG_PARTED_HOOKS_FILE##*/} skip-reset=$MIG_PARTED_SKIP_RESET\
 mode-only=$MIG_PARTED_MODE_CHANGE_ONLY" >> record
}
apply-start() { record apply-start "$@"; }
pre-apply-mode() { record pre-apply-mode; }
pre-apply-config() { record pre-apply-config; }
apply-exit() { record apply-exit; }
refresh-cdi() { record refresh-cdi; }
"""


@pytest.mark.parametrize(
    ("runner", "prefix", "flags", "wanted"),
    [
        ("cli", ["mig"], ["-k", "hooks.yaml"], "false"),
        ("mig_parted", [], ["--hooks-file", "hooks.yaml", "--mode-only"], "true"),
        ("mig_parted", [], ["-m"], "true"),  # the hooks file from MIG_PARTED_HOOKS_FILE
    ],
)
def test_mig_parteds_own_hooks_file_runs_as_under_mig_parted(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    runner: str,
    prefix: list[str],
    flags: list[str],
    wanted: str,
) -> None:
    """deployments/systemd/hooks-default.yaml, its workdir pointed here (the one change)."""
    text = (UPSTREAM / "deployments/systemd/hooks-default.yaml").read_text()
    (tmp_path / "hooks.yaml").write_text(text.replace("/etc/nvidia-mig-manager", str(tmp_path)))
    (tmp_path / "hooks.sh").write_text(HOOKS_SH)
    config = str(UPSTREAM / "examples/config.yaml")
    env = {
        "NODEAGENT_SIMULATE": "a100-40gb",
        "NODEAGENT_SIM_STATE": str(tmp_path / "node.json"),
        "MIG_PARTED_HOOKS_FILE": str(tmp_path / "hooks.yaml"),
    }
    run = request.getfixturevalue(runner)
    res = run(*prefix, "apply", "-f", config, "-c", "all-balanced", *flags, env=env)
    assert res.returncode == 0, res.stderr
    common = (
        f"config=all-balanced file=config.yaml hooks=hooks.yaml skip-reset=false mode-only={wanted}"
    )
    steps = ["apply-start all-balanced", "pre-apply-mode"]
    steps += ["pre-apply-config"] if wanted == "false" else []  # --mode-only: no MIG devices
    assert _record(tmp_path) == [
        f"{step} {common}" for step in [*steps, "apply-exit", "refresh-cdi"]
    ]
