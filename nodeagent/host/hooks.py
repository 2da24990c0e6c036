"""Commands run around a MIG change, from mig-parted's hooks file (`api/hooks/v1`, the format
of mig-manager's `hooks.yaml`), so an existing file works unchanged:

    version: v1
    hooks:
      apply-start:        # a change is planned; nothing changed yet, clients not paused
        - command: /bin/bash
          args: ["-c", "echo applying $MIG_PARTED_SELECTED_CONFIG"]
          envs: {KEY: value}          # added to the agent's environment (not over MIG_PARTED_*)
          workdir: /etc/nodeagent     # optional
      pre-apply-mode:     # clients paused; before the MIG mode changes on a GPU
      pre-apply-config:   # clients paused; before GPU and compute instances change
      apply-exit:         # after the change, failed or not; before clients are restored

The commands of a hook run one after the other, each within the hook timeout; the first that
fails (exit status, signal, timeout, cannot start) stops the hook and fails the change with its
file position, command and last lines of output. The file is strict: unknown keys or hook
names, and values of the wrong type, are errors naming their position.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import yaml

from nodeagent.base.commands import run_in_session
from nodeagent.base.configfile import compose, read_text
from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.logs import get_logger

log = get_logger("nodeagent.host.hooks")
VERSION = "v1"
HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
HOOK_KEYS = ("command", "args", "envs", "workdir")
STANDARD_TAG = "tag:yaml.org,2002:"
OUTPUT_LINES = 5  # of a failing command's output, in the failure reason
# A hook's command, args and envs together, bytes: the kernel refuses one argument over
# 128 KiB (MAX_ARG_STRLEN) and a whole command line over ARG_MAX (2 MiB, the environment
# included). A file whose aliases repeat a long string is bad input here, before anything
# runs, not a hook that "could not start" (E2BIG) in the middle of a change.
MAX_HOOK_BYTES = 128 * 1024


class HookError(AgentError):
    """A hook command failed: the change stops (before) or is reported failed (after)."""


@dataclass(frozen=True)
class Hook:
    command: str
    args: tuple[str, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    where: str = ""  # file:line:col

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]


@dataclass(frozen=True)
class HooksFile:
    source: str
    hooks: Mapping[str, tuple[Hook, ...]] = field(default_factory=dict)


class _Errors:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[tuple[int, int, str]] = []

    def at(self, node: yaml.Node) -> str:
        return f"{self.source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def add(self, node: yaml.Node, message: str) -> None:
        self.items.append(
            (node.start_mark.line, node.start_mark.column, f"{self.at(node)}: {message}")
        )

    def raise_if_any(self) -> None:
        if not self.items:
            return
        lines = [m for _, _, m in sorted(self.items)]
        if len(lines) == 1:
            raise ConfigError(lines[0])
        raise ConfigError(f"{self.source} has {len(lines)} errors:\n  " + "\n  ".join(lines[:20]))


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}" if node.value else "empty"


def _string(node: yaml.Node, errors: _Errors, what: str) -> str | None:
    """A plain string scalar (a number or a boolean is refused, as mig-parted's Go types do)."""
    if not isinstance(node, yaml.ScalarNode) or node.tag != STANDARD_TAG + "str":
        errors.add(node, f"{what} must be a string, not {_kind(node)}")
        return None
    return str(node.value)


def _pairs(node: yaml.Node, errors: _Errors, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        errors.add(node, f"{what} must be a mapping, not {_kind(node)}")
        return []
    seen: set[str] = set()
    out = []
    for key, value in node.value:
        name = _string(key, errors, f"a key of {what}")
        if name is None:
            continue
        if name in seen:
            errors.add(key, f"{what} has key {name!r} twice")
            continue
        seen.add(name)
        out.append((name, key, value))
    return out


def _too_long(texts: list[str]) -> bool:
    size = 0
    for text in texts:  # stops at the limit: a million aliases of one long string are cheap
        size += len(os.fsencode(text)) + 1
        if size > MAX_HOOK_BYTES:
            return True
    return False


def _hook(node: yaml.Node, errors: _Errors, what: str) -> Hook | None:
    fields: dict[str, yaml.Node] = {}
    for name, key, value in _pairs(node, errors, what):
        if name not in HOOK_KEYS:
            errors.add(key, f"{what}: unknown key {name!r}; expected one of {', '.join(HOOK_KEYS)}")
        else:
            fields[name] = value
    if not isinstance(node, yaml.MappingNode):
        return None
    if "command" not in fields:
        errors.add(node, f"{what} has no command")
        return None
    command = _string(fields["command"], errors, f"{what}: command")
    if command is not None and not command.strip():
        errors.add(fields["command"], f"{what}: command must not be empty")
    args: list[str] = []
    if "args" in fields:
        if isinstance(fields["args"], yaml.SequenceNode):
            args = [
                a
                for i, item in enumerate(fields["args"].value)
                if (a := _string(item, errors, f"{what}: args[{i}]")) is not None
            ]
        elif not (isinstance(fields["args"], yaml.ScalarNode) and not fields["args"].value):
            errors.add(fields["args"], f"{what}: args must be a list of strings")
    envs: list[tuple[str, str]] = []
    if "envs" in fields and not _empty(fields["envs"]):
        for name, _, value in _pairs(fields["envs"], errors, f"{what}: envs"):
            text = _string(value, errors, f"{what}: envs {name}")
            if text is not None:
                envs.append((name, text))
    workdir = None
    if "workdir" in fields and not _empty(fields["workdir"]):
        workdir = _string(fields["workdir"], errors, f"{what}: workdir")
    if _too_long([command or "", *args, *(f"{k}={v}" for k, v in envs)]):
        errors.add(
            node,
            f"{what}: its command, args and envs are more than {MAX_HOOK_BYTES:,} bytes (the"
            " kernel refuses longer command lines)",
        )
        return None
    if command is None:
        return None
    return Hook(command, tuple(args), tuple(envs), workdir or None, errors.at(node))


def _empty(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == STANDARD_TAG + "null"


def parse_hooks(text: str, source: str) -> HooksFile:
    """Parse a hooks file; raise ConfigError listing every problem with its position."""
    root = compose(text, source, f"'version: {VERSION}' and 'hooks'")
    errors = _Errors(source)
    hooks: dict[str, tuple[Hook, ...]] = {}
    fields = {name: (key, value) for name, key, value in _pairs(root, errors, "the hooks file")}
    for name, (key, _) in fields.items():
        if name not in ("version", "hooks"):
            errors.add(key, f"unknown key {name!r}; expected version and hooks")
    if isinstance(root, yaml.MappingNode):
        version = fields.get("version")
        if version is None:
            errors.add(root, f"no version; expected 'version: {VERSION}'")
        elif not isinstance(version[1], yaml.ScalarNode) or version[1].value != VERSION:
            errors.add(version[1], f"version must be {VERSION!r}, not {_kind(version[1])}")
        body = fields.get("hooks")
        for name, key, value in _pairs(body[1], errors, "hooks") if body else []:
            if name not in HOOK_NAMES:
                errors.add(key, f"unknown hook {name!r}; expected one of {', '.join(HOOK_NAMES)}")
            elif isinstance(value, yaml.SequenceNode):
                found = (_hook(item, errors, f"{name}[{i}]") for i, item in enumerate(value.value))
                hooks[name] = tuple(h for h in found if h is not None)
            elif not _empty(value):
                errors.add(value, f"hook {name} must be a list of commands, not {_kind(value)}")
    errors.raise_if_any()
    return HooksFile(source, hooks)


def load_hooks(path: str | None) -> HooksFile:
    """Read and parse a hooks file (bounded: nodeagent.base.configfile; a pipe too, read
    once: `-k <(generate)`). Raises ConfigError."""
    if not path:
        raise ConfigError("no hooks file: pass --hooks-file FILE")
    text = read_text(path, "hooks file", pipe=True)
    return parse_hooks(text, "<stdin>" if path == "-" else path)


# mig-parted's apply gives its hooks one variable per apply flag that has one (GetHooksEnvsMap),
# "true"/"false" for its two switches. A command that has them (`mig apply --skip-reset
# --mode-only`) says so for the run with `apply_switches`; the agent never sets them.
SWITCHES = ("MIG_PARTED_SKIP_RESET", "MIG_PARTED_MODE_CHANGE_ONLY")
_switches: contextvars.ContextVar[tuple[bool, bool]] = contextvars.ContextVar(
    "mig_parted_switches", default=(False, False)
)


@contextlib.contextmanager
def apply_switches(skip_reset: bool, mode_only: bool) -> Iterator[None]:
    """Within: hooks are told MIG_PARTED_SKIP_RESET / MIG_PARTED_MODE_CHANGE_ONLY as given."""
    token = _switches.set((skip_reset, mode_only))
    try:
        yield
    finally:
        _switches.reset(token)


def hook_env(
    name: str,
    hooks: HooksFile,
    config_file: str | None,
    mig_config: str | None,
    sharing_config: str | None,
    result: str | None = None,
) -> dict[str, str]:
    """What a hook command is told: mig-parted's variables (the config file, the selected
    config, the hooks file, --skip-reset and --mode-only), nodeagent's own, and for apply-exit
    the outcome."""
    env = {
        "MIG_PARTED_CONFIG_FILE": config_file or "",
        "MIG_PARTED_SELECTED_CONFIG": mig_config or sharing_config or "",
        "MIG_PARTED_HOOKS_FILE": hooks.source,
        **{key: str(on).lower() for key, on in zip(SWITCHES, _switches.get(), strict=True)},
        "NODEAGENT_HOOK": name,
        "NODEAGENT_MIG_CONFIG": mig_config or "",
        "NODEAGENT_SHARING_CONFIG": sharing_config or "",
    }
    if result is not None:
        env["NODEAGENT_RESULT"] = result
    return env


def _tail(output: bytes) -> str:
    lines = output.decode("utf-8", "replace").strip().splitlines()
    return " | ".join(lines[-OUTPUT_LINES:])


def run_hook(hooks: HooksFile, name: str, env: Mapping[str, str], timeout_seconds: float) -> int:
    """Run the commands of hook `name` in order (none: nothing to do); returns how many ran.
    Each gets the agent's environment, its own envs, then `env` (as mig-parted, the tool's
    variables win over a hook's envs). Raises HookError at the
    first that fails; a command that outlives the timeout is killed with its process group."""
    commands = hooks.hooks.get(name, ())
    for i, hook in enumerate(commands):
        what = f"hook {name}[{i}] ({hook.where}) {shlex.join(hook.argv)}"
        environment = {**os.environ, **dict(hook.envs), **env}
        try:
            proc = run_in_session(
                hook.argv, timeout_seconds, cwd=hook.workdir, env=environment,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
        except OSError as err:
            raise HookError(f"{what} could not start: {err.strerror or err}") from err
        except subprocess.TimeoutExpired as err:
            raise HookError(f"{what} did not finish within {timeout_seconds:g} s") from err
        output = proc.stdout
        if proc.returncode != 0:
            how = (
                f"was killed by signal {-proc.returncode}"
                if proc.returncode < 0
                else f"exited with {proc.returncode}"
            )
            tail = _tail(output)
            raise HookError(f"{what} {how}" + (f": {tail}" if tail else ""))
        log.info("hook.ran", hook=name, index=i, command=hook.command, output=_tail(output))
        # all of it with -d, where mig-parted shows a hook's output
        log.debug("hook.output", hook=name, index=i, output=output.decode("utf-8", "replace"))
    return len(commands)
