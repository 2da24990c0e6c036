"""mig-parted's hooks file (api/hooks/v1): parsed strictly with positions, run in order, each
within its timeout, the first failure named with its file position, command and output."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.host.hooks import (
    HookError,
    HooksFile,
    apply_switches,
    hook_env,
    load_hooks,
    parse_hooks,
    run_hook,
)
from tests.support.host import gone_within

# mig-parted's own default hooks file, as users of its systemd mig-manager have it (see
# tests/fixtures/upstream/README.md for its source and commit).
UPSTREAM_DEFAULT = (
    Path(__file__).resolve().parents[1]
    / "fixtures/upstream/mig-parted/deployments/systemd/hooks-default.yaml"
)


def test_mig_parteds_own_hooks_file_is_read_as_is() -> None:
    hooks = load_hooks(str(UPSTREAM_DEFAULT))
    assert list(hooks.hooks) == ["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"]
    exit_hooks = hooks.hooks["apply-exit"]
    assert [h.args[-1] for h in exit_hooks] == [
        "source hooks.sh; apply-exit",
        "source hooks.sh; refresh-cdi",
    ]
    assert exit_hooks[0].workdir == "/etc/nvidia-mig-manager"
    assert exit_hooks[0].command == "/bin/bash"
    assert exit_hooks[1].where == f"{UPSTREAM_DEFAULT}:19:7"  # the second apply-exit command


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "hooks.yaml: the file is empty"),
        ("version: v2\nhooks: {}\n", "hooks.yaml:1:10: version must be 'v1', not 'v2'"),
        ("hooks: {}\n", "hooks.yaml:1:1: no version"),
        ("version: v1\nhook: {}\n", "hooks.yaml:2:1: unknown key 'hook'"),
        ("version: v1\nhooks:\n  apply_start: []\n", "hooks.yaml:3:3: unknown hook 'apply_start'"),
        ("version: v1\nhooks:\n  apply-start: /bin/true\n", "hooks.yaml:3:16: hook apply-start must be a list"),
        ("version: v1\nhooks:\n  apply-exit:\n    - args: [a]\n", "hooks.yaml:4:7: apply-exit[0] has no command"),
        ("version: v1\nhooks:\n  apply-exit:\n    - command: 7\n", "hooks.yaml:4:16: apply-exit[0]: command must be a string, not '7'"),
        ("version: v1\nhooks:\n  apply-exit:\n    - {command: x, args: [a, 1]}\n", "apply-exit[0]: args[1] must be a string"),
        ("version: v1\nhooks:\n  apply-exit:\n    - {command: x, args: a}\n", "apply-exit[0]: args must be a list of strings"),
        ("version: v1\nhooks:\n  apply-exit:\n    - {command: x, env: {A: b}}\n", "apply-exit[0]: unknown key 'env'"),
        ("version: v1\nhooks:\n  apply-exit:\n    - {command: x, envs: {A: true}}\n", "apply-exit[0]: envs A must be a string"),
        ("version: v1\nhooks:\n  apply-exit:\n    - {command: ''}\n", "command must not be empty"),
        ("version: v1\nhooks: [\n", "hooks.yaml:3:1: not valid YAML"),
        ("version: v1\nversion: v1\nhooks: {}\n", "hooks.yaml:2:1: the hooks file has key 'version' twice"),
    ],
)  # fmt: skip
def test_a_bad_hooks_file_is_one_error_naming_the_position(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_hooks(text, "hooks.yaml")
    assert message in str(err.value)


def test_every_error_of_a_file_is_reported_at_once() -> None:
    text = "version: v3\nhooks:\n  apply-exit:\n    - {command: 1}\n  bogus: []\n"
    with pytest.raises(ConfigError) as err:
        parse_hooks(text, "h.yaml")
    assert str(err.value).startswith("h.yaml has 3 errors:")


def test_an_unreadable_file_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read hooks file .*missing\.yaml"):
        load_hooks(str(tmp_path / "missing.yaml"))
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"version: v1\n\xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_hooks(str(binary))


def _hooks(tmp_path: Path, *scripts: str, name: str = "apply-exit") -> HooksFile:
    lines = [f"version: v1\nhooks:\n  {name}:\n"]
    for script in scripts:
        lines.append(f"    - command: /bin/sh\n      args: ['-c', {script!r}]\n")
    path = tmp_path / "hooks.yaml"
    path.write_text("".join(lines))
    return load_hooks(str(path))


def test_commands_run_in_order_with_the_environment(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hooks = _hooks(
        tmp_path,
        f'echo "one $MIG_PARTED_SELECTED_CONFIG" >> {out}',
        f'echo "two $NODEAGENT_HOOK $PATH_IS_KEPT" >> {out}',
    )
    ran = run_hook(hooks, "apply-exit", {"MIG_PARTED_SELECTED_CONFIG": "all-balanced",
                                         "NODEAGENT_HOOK": "apply-exit",
                                         "PATH_IS_KEPT": "yes"}, 10)  # fmt: skip
    assert ran == 2
    assert out.read_text().splitlines() == ["one all-balanced", "two apply-exit yes"]
    assert run_hook(hooks, "apply-start", {}, 10) == 0  # not in the file: nothing to do


def test_the_first_failure_stops_the_hook_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hooks = _hooks(
        tmp_path,
        f"echo first >> {out}",
        "echo 'nvidia-ctk: no such device' >&2; exit 4",
        f"echo never >> {out}",
    )
    with pytest.raises(HookError) as err:
        run_hook(hooks, "apply-exit", {}, 10)
    message = str(err.value)
    assert message.startswith(f"hook apply-exit[1] ({tmp_path / 'hooks.yaml'}:6:7) /bin/sh -c ")
    assert "exited with 4: nvidia-ctk: no such device" in message
    assert out.read_text().splitlines() == ["first"]


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hooks = _hooks(tmp_path, f"sleep 60 & echo $! > {pidfile}; wait")
    with pytest.raises(HookError, match=r"did not finish within 0.5 s"):
        run_hook(hooks, "apply-exit", {}, 0.5)
    assert gone_within(int(pidfile.read_text()), 10)


def test_a_command_that_cannot_start_is_named(tmp_path: Path) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text("version: v1\nhooks:\n  apply-start:\n    - command: /no/such/program\n")
    with pytest.raises(HookError, match=r"\) /no/such/program could not start: No such file"):
        run_hook(load_hooks(str(path)), "apply-start", {}, 10)
    path.write_text(
        "version: v1\nhooks:\n  apply-start:\n    - {command: /bin/true, workdir: /no/such/dir}\n"
    )
    with pytest.raises(HookError, match="could not start"):
        run_hook(load_hooks(str(path)), "apply-start", {}, 10)


def test_hooks_are_told_mig_parteds_variables_which_their_envs_do_not_override(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    path = tmp_path / "hooks.yaml"
    path.write_text(
        "version: v1\nhooks:\n  apply-start:\n    - command: /bin/sh\n"
        f"      args: ['-c', 'echo $MIG_PARTED_SELECTED_CONFIG $MIG_PARTED_SKIP_RESET"
        f" $MIG_PARTED_MODE_CHANGE_ONLY $OWN >> {out}']\n"
        "      envs: {MIG_PARTED_SELECTED_CONFIG: from-the-hook, OWN: kept}\n"
    )
    hooks = load_hooks(str(path))
    env = hook_env("apply-start", hooks, "mig.yaml", "all-balanced", None)
    assert {k: v for k, v in env.items() if k.startswith("MIG_PARTED_")} == {
        "MIG_PARTED_CONFIG_FILE": "mig.yaml",
        "MIG_PARTED_SELECTED_CONFIG": "all-balanced",
        "MIG_PARTED_HOOKS_FILE": str(path),
        "MIG_PARTED_SKIP_RESET": "false",
        "MIG_PARTED_MODE_CHANGE_ONLY": "false",
    }
    run_hook(hooks, "apply-start", env, 10)
    with apply_switches(skip_reset=True, mode_only=False):
        run_hook(hooks, "apply-start", hook_env("apply-start", hooks, None, "x", None), 10)
    assert out.read_text().splitlines() == ["all-balanced false false kept", "x true false kept"]
