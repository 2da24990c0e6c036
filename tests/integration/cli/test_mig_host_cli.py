"""`nodeagent mig apply|assert` and mig-manager's host duties, as a user runs them: a MIG mode
change that waits for a reboot (exit 5), the reboot command, the CDI refresh after a change
(a fake nvidia-ctk on PATH records its argv), and the configs generated from the GPUs when no
file is given."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.settings.groups import DEFAULT_CDI_COMMANDS
from tests.support.cli import Result, assert_one_error
from tests.support.host import fake_command, recorded

Cli = Callable[..., Result]


@pytest.fixture
def node(tmp_path: Path, cli: Cli) -> Callable[..., Result]:
    """nodeagent on one emulated node (spec given per call), its state in tmp_path, with
    tmp_path/bin first on PATH (fake host commands go there)."""
    (tmp_path / "bin").mkdir()
    path = f"{tmp_path / 'bin'}:{os.environ.get('PATH', '')}"

    def run(*args: str, spec: str, env: dict[str, str] | None = None) -> Result:
        state = str(tmp_path / "node.json")
        return cli(
            "--simulate", spec, "--sim-state", state, *args, env={"PATH": path, **(env or {})}
        )

    return run


def _modes(node: Callable[..., Result], spec: str) -> list[str]:
    res = node("status", spec=spec)
    return [line.split()[1] for line in res.stdout.splitlines() if line.startswith("  MIG ")]


def test_a_mode_change_that_needs_a_reboot_exits_5_then_converges_after_it(
    node: Callable[..., Result],
) -> None:
    spec = "a100-40gbx2:no-reset"
    res = node("mig", "apply", "-c", "all-balanced", spec=spec)  # no -f: generated configs
    assert_one_error(res, 5, "GPUs 0, 1", "pending until the node reboots", "reset")
    assert _modes(node, spec) == ["disabled", "disabled"]  # pending, see `status`
    assert node("mig", "assert", "-c", "all-balanced", spec=spec).returncode == 1
    assert node("sim", "reboot", spec=spec).returncode == 0
    assert _modes(node, spec) == ["enabled", "enabled"]
    res = node("mig", "apply", "-c", "all-balanced", spec=spec)
    assert res.returncode == 0, res.stderr
    assert node("mig", "assert", "-c", "all-balanced", spec=spec).returncode == 0


def test_the_other_gpus_change_while_one_waits_for_a_reboot(node: Callable[..., Result]) -> None:
    spec = "a100-40gb:no-reset,h200"
    res = node("mig", "apply", "-c", "all-enabled", spec=spec)
    assert_one_error(res, 5, "GPU 0: MIG mode enabled is pending until the node reboots")
    assert _modes(node, spec) == ["disabled", "enabled"]  # the H200 needs no reset
    node("sim", "reboot", spec=spec)
    assert _modes(node, spec) == ["enabled", "disabled"]  # Hopper's mode does not survive it
    assert node("mig", "apply", "-c", "all-enabled", spec=spec).returncode == 0
    assert _modes(node, spec) == ["enabled", "enabled"]


def test_with_reboot_runs_the_reboot_command(node: Callable[..., Result], tmp_path: Path) -> None:
    script = fake_command(tmp_path / "bin", "fake-reboot")
    spec = "a100-40gbx2:no-reset"
    args = ("mig", "apply", "-c", "all-enabled", "--with-reboot")
    res = node(*args, "--reboot-command", "fake-reboot -f now", spec=spec)
    assert res.returncode == 5 and "Traceback" not in res.stderr
    # the reboot is logged (a warning), then the one sentence
    logged, said = res.stderr.strip().splitlines()
    assert '"event": "host.reboot"' in logged and "pending until the node reboots" in said
    assert recorded(script) == ["fake-reboot -f now"]
    # Without the switch the command is not run.
    node("mig", "apply", "-c", "all-enabled", "--reboot-command", "fake-reboot", spec=spec)
    assert recorded(script) == ["fake-reboot -f now"]


def test_cdi_refresh_runs_after_a_change_only(node: Callable[..., Result], tmp_path: Path) -> None:
    ctk = fake_command(tmp_path / "bin", "nvidia-ctk")
    apply = ("mig", "apply", "-c", "all-balanced", "--cdi-refresh")
    assert node(*apply, spec="h200x2").returncode == 0
    # mig-manager's commands (reconfigure.go handleCDI, createCDISpec), in its order
    assert recorded(ctk) == list(DEFAULT_CDI_COMMANDS)
    assert recorded(ctk)[0] == "nvidia-ctk system create-device-nodes --control-devices"
    assert "--mode=management" in recorded(ctk)[1]
    assert node(*apply, spec="h200x2").returncode == 0  # nothing changed: no refresh
    assert len(recorded(ctk)) == 2
    res = node("mig", "apply", "-c", "all-disabled", spec="h200x2")  # not asked for: none
    assert res.returncode == 0 and len(recorded(ctk)) == 2


@pytest.mark.parametrize(
    ("says", "code", "words"),
    [
        ("permission denied", 1, ("the CDI refresh command 'my-cdi --all'", "exited with 1",
                                  "permission denied")),
        ("", 7, ("the CDI refresh command", "exited with 7")),
    ],
)  # fmt: skip
def test_a_failing_cdi_command_fails_the_apply_after_the_change(
    node: Callable[..., Result], tmp_path: Path, says: str, code: int, words: tuple[str, ...]
) -> None:
    fake_command(tmp_path / "bin", "my-cdi", exit_code=code, says=says)
    apply = ("mig", "apply", "-c", "all-balanced", "--cdi-refresh", "--cdi-command", "my-cdi --all")
    assert_one_error(node(*apply, spec="h200x2"), 3, *words)
    assert node("mig", "assert", "-c", "all-balanced", spec="h200x2").returncode == 0


def test_a_missing_cdi_command_is_named(node: Callable[..., Result]) -> None:
    res = node("mig", "apply", "-c", "all-balanced", "--cdi-refresh", "--cdi-command",
               "no-such-ctk cdi generate", spec="h200x2")  # fmt: skip
    assert_one_error(res, 3, "'no-such-ctk cdi generate' could not start")


@pytest.mark.parametrize(
    ("flags", "env", "words"),
    [
        (["--cdi-command", "'unclosed"], {}, ("cdi-command", "cannot be split")),
        (["--reboot-command", "   "], {}, ("reboot-command", "must not be empty")),
        ([], {"WITH_REBOOT": "maybe"}, ("WITH_REBOOT", "true or false")),
        ([], {"CDI_ENABLED": "2"}, ("CDI_ENABLED", "true or false")),
        ([], {"NODEAGENT_MIG_CDI_COMMANDS": " ; "}, ("NODEAGENT_MIG_CDI_COMMANDS", "at least one")),
    ],
)
def test_bad_host_duty_settings_exit_2_and_change_nothing(
    node: Callable[..., Result], flags: list[str], env: dict[str, str], words: tuple[str, ...]
) -> None:
    res = node("mig", "apply", "-c", "all-enabled", *flags, spec="h200x2", env=env)
    assert_one_error(res, 2, *words)
    assert _modes(node, "h200x2") == ["disabled", "disabled"]


@pytest.mark.parametrize(
    ("spec", "name", "profiles"),
    [
        ("h200x2", "all-1g.18gb", ["1g.18gb"] * 7),
        ("h200x2", "all-balanced", ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]),
        ("a30x2", "all-balanced", ["1g.6gb", "1g.6gb", "2g.12gb"]),
        ("a100-40gb,h200", "all-balanced", None),  # one entry per model, by device filter
    ],
)
def test_generated_configs_are_used_without_a_file(
    node: Callable[..., Result], spec: str, name: str, profiles: list[str] | None
) -> None:
    res = node("mig", "apply", "-c", name, spec=spec)
    assert res.returncode == 0, res.stderr
    assert node("mig", "assert", "-c", name, spec=spec).returncode == 0
    gpus = json.loads(node("status", "--output", "json", spec=spec).stdout)["gpus"]
    for gpu in gpus:
        got = sorted(s["profile"] for s in gpu["slices"])
        assert got == sorted(profiles or got) and len(got) >= 3, (gpu["name"], got)


def test_without_a_file_a_name_is_needed(node: Callable[..., Result]) -> None:
    assert_one_error(node("mig", "apply", spec="h200x2"), 2, "-c NAME", "generate-config")
    assert_one_error(node("mig", "assert", spec="h200x2"), 2, "-c NAME")
