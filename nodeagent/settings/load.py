"""The loader: defaults -> the settings file -> the environment -> flags, every error at once;
the settings file read with positions; what a reload may take; the effective settings as a
document."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from nodeagent.base.errors import ConfigError
from nodeagent.settings.groups import GROUPS, MAX_ERRORS, VERSION, Settings
from nodeagent.settings.parsers import Invalid
from nodeagent.settings.specs import _STANDARD, BY_KEY, SETTINGS_FILE_ENV, SPECS, Spec

# -- the settings file ------------------------------------------------------------------


class FileValue(NamedTuple):
    raw: Any
    where: str  # file:line:col


def _read_file(file: str, errors: list[str]) -> dict[str, FileValue]:
    """Every `group.key` of the file with its raw value and position; the file may be a pipe
    (`--config <(generate)`, read once: bounded in size and time)."""
    import yaml  # only when there is a file: the import costs 10 ms of every command

    from nodeagent.base.configfile import Errors, check_plain, compose_document, read_bytes

    try:
        data = read_bytes(file, "settings file", pipe=True)
    except ConfigError as err:
        errors.append(str(err))
        return {}
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as err:
        errors.append(f"{file}: not UTF-8 text (byte {err.start})")
        return {}
    try:  # the one YAML reader: bounded in size and aliases
        root = compose_document(source, file)
    except ConfigError as err:
        errors.append(str(err))
        return {}

    def at(node: yaml.Node) -> str:
        return f"{file}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    if not isinstance(root, yaml.MappingNode) or not root.tag.startswith(_STANDARD):
        errors.append(f"{file}: must be a mapping with version: {VERSION}")
        return {}
    out: dict[str, FileValue] = {}
    version = None
    seen: set[str] = set()
    for key, value in root.value:
        if not isinstance(key, yaml.ScalarNode):
            errors.append(f"{at(key)}: a key must be a name, not {_node_kind(key)}")
            continue
        name = key.value
        if name in seen:
            errors.append(f"{at(key)}: {name} given twice")
            continue
        seen.add(name or "")
        if not value.tag.startswith(_STANDARD):  # `!custom` on a group or on version
            errors.append(f"{at(value)}: {name}: tag {value.tag!r} is not allowed here")
            continue
        if name == "version":
            version = value.value if isinstance(value, yaml.ScalarNode) else None
            if version != VERSION:
                errors.append(f"{at(value)}: version must be {VERSION!r}, not {version!r}")
            continue
        if name not in GROUPS:
            known = ", ".join(["version", *GROUPS])
            errors.append(f"{at(key)}: unknown key {name!r} (known: {known})")
            continue
        if not isinstance(value, yaml.MappingNode):
            errors.append(f"{at(value)}: {name} must be a mapping")
            continue
        for sub, node in value.value:
            if not isinstance(sub, yaml.ScalarNode):
                errors.append(f"{at(sub)}: a key in {name} must be a name, not {_node_kind(sub)}")
                continue
            dotted = f"{name}.{sub.value}"
            if dotted not in BY_KEY:
                known = ", ".join(s.key for s in SPECS if s.group == name)
                errors.append(f"{at(sub)}: unknown key {dotted!r} (known in {name}: {known})")
                continue
            if dotted in out:
                errors.append(f"{at(sub)}: {dotted} given twice")
                continue
            problems = Errors(file)
            check_plain(node, problems, "the settings file")
            if problems.items:  # !!binary, !!set, !custom, `!!int abc`: at their position
                errors += [f"{item} ({dotted})" for item in problems.items]
                continue
            try:
                raw = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
                problem = getattr(err, "problem", None) or "it cannot be built"
                errors.append(f"{at(node)}: {dotted}: cannot read the value: {problem}")
                continue
            out[dotted] = FileValue(raw, at(node))
    if version is None and root.value:
        errors.append(f"{file}: the first key must be version: {VERSION}")
    return out


def _node_kind(node: Any) -> str:
    import yaml

    return "a mapping" if isinstance(node, yaml.MappingNode) else "a list"


# -- the loader --------------------------------------------------------------------------


class Source(NamedTuple):
    """Where a setting's value came from: default, file:line:col, VARIABLE or --flag."""

    kind: str
    where: str


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    file: str | None = None,
    groups: Iterable[str] = GROUPS,
) -> tuple[Settings, dict[str, Source]]:
    """The effective settings of `groups` (other groups keep their defaults) and the source of
    every value. `flags` maps Spec.dest to a flag's value (None: not given); the settings file
    may be a pipe (read once). Raises ConfigError with every problem of every
    source."""
    flags = flags or {}
    environ = environ if environ is not None else {}
    wanted = set(groups)
    errors: list[str] = []
    file = file or environ.get(SETTINGS_FILE_ENV) or None
    from_file = _read_file(file, errors) if file else {}
    values: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    sources: dict[str, Source] = {}
    for spec in SPECS:
        if spec.group not in wanted:
            continue
        candidates: list[tuple[Source, Any]] = []
        if spec.dotted in from_file:
            fv = from_file[spec.dotted]
            candidates.append((Source("file", fv.where), fv.raw))
        for var in reversed(spec.env):  # the first variable listed wins
            if var in environ:
                candidates.append((Source("env", var), environ[var]))
        given = flags.get(spec.dest)
        if given is not None:
            raw = ";".join(given) if spec.repeat and isinstance(given, list) else given
            if not (spec.repeat and isinstance(given, list) and not given):
                candidates.append((Source("flag", spec.flag or spec.dotted), raw))
        # Every source is checked, not only the one that wins: a bad value in the file is an
        # error even while a flag overrides it (it would fail once the flag is dropped).
        for source, raw in candidates:
            try:
                values[spec.group][spec.field] = spec.parse(raw)
                sources[spec.dotted] = source
            except Invalid as err:
                errors.append(f"{_where(source, spec)}: {err}")
    built = {name: cls(**values[name]) for name, cls in GROUPS.items()}
    settings = Settings(**built, file=file)
    if not errors:
        errors += _cross_checks(settings, wanted)
    if errors:
        raise _error(errors)
    return settings, sources


def _where(source: Source, spec: Spec) -> str:
    if source.kind == "file":
        return f"{source.where}: {spec.dotted}"
    if source.kind == "env":
        return f"environment variable {source.where}"
    return source.where


def _cross_checks(s: Settings, groups: set[str]) -> list[str]:
    problems = []
    if "kube" in groups and s.kube.enabled:
        if not s.kube.node_name:
            problems.append(
                "--kube needs the node's name: --node-name or NODE_NAME (the downward API)"
            )
        if s.mig.config:
            problems.append(
                "with Kubernetes the MIG config name comes from the node label"
                f" {s.kube.mig_config_label}; drop -c (keep -f, the file of configs)"
            )
        if s.kube.node_feature_api and not s.kube.pod_namespace:
            problems.append(
                "kube.node-feature-api needs the agent's namespace: POD_NAMESPACE (the downward"
                " API) or --pod-namespace"
            )
        if "sharing" in groups and s.sharing.config:
            problems.append(
                "with Kubernetes the sharing config name comes from the node label"
                " nodeagent.io/sharing.config; drop --sharing-config (keep --sharing-file)"
            )
    elif "reconcile" in groups and s.mig.config and not s.mig.config_file:
        problems.append("a MIG config needs both the file and the name (-f and -c)")
    if {"dra", "kube"} <= groups and s.dra.enabled and not s.kube.enabled:
        problems.append("--dra needs --kube: the driver publishes ResourceSlices to the API")
    if "sharing" in groups and s.sharing.config and not s.sharing.config_file:
        problems.append(
            "a sharing config needs both the file and the name (--sharing-file and"
            " --sharing-config)"
        )
    if "sharing" in groups and s.sharing.config and s.mig.config:
        problems.append(
            "give a MIG config (-c) or a sharing config (--sharing-config), not both: a sharing"
            " config says what every GPU it names becomes, MIG included"
        )
    if "sharing" in groups and s.sharing.workload_file and (s.sharing.config or s.mig.config):
        given = "--sharing-config" if s.sharing.config else "a MIG config (-c)"
        problems.append(
            f"give a workload file (--workload-file) or {given}, not both: the planned config"
            " says what every GPU becomes"
        )
    if (
        "labels" in groups
        and s.labels.device_plugin_config_file
        and s.labels.device_plugin_config_dir
    ):
        problems.append(
            "give a device plugin config file or a folder of named configs, not both"
            " (labels.device-plugin-config-file, labels.device-plugin-config-dir)"
        )
    if "mps" in groups and s.mps.enabled and s.mps.pinned_memory and s.mps.devices:
        for part in s.mps.pinned_memory.split(","):
            index, sep, _ = part.rpartition("=")
            if sep and int(index) not in s.mps.devices:
                problems.append(
                    f"pinned memory limit given for GPU {index}, which is not in mps.devices"
                )
    return problems


def _error(errors: list[str]) -> ConfigError:
    if len(errors) == 1:
        return ConfigError(errors[0])
    shown = errors[:MAX_ERRORS]
    more = f"\n  ... and {len(errors) - MAX_ERRORS} more" if len(errors) > MAX_ERRORS else ""
    return ConfigError(f"{len(errors)} settings errors:\n  " + "\n  ".join(shown) + more)


# -- reload --------------------------------------------------------------------------------


def merge_reload(old: Settings, new: Settings) -> tuple[Settings, list[str]]:
    """The settings a reload may take: `new` for hot settings, `old` for the restart-only ones;
    and the dotted keys whose change needs a restart (refused, the old value stays)."""
    refused: list[str] = []
    groups: dict[str, Any] = {}
    for name in GROUPS:
        old_group, new_group = getattr(old, name), getattr(new, name)
        changes = {}
        for spec in (s for s in SPECS if s.group == name):
            before, after = getattr(old_group, spec.field), getattr(new_group, spec.field)
            if before == after:
                continue
            if spec.hot:
                changes[spec.field] = after
            else:
                refused.append(spec.dotted)
        groups[name] = dataclasses.replace(old_group, **changes)
    return Settings(**groups, file=new.file), refused


# -- showing ------------------------------------------------------------------------------


def as_document(settings: Settings) -> dict[str, Any]:
    """The effective settings in the file's own form (what `nodeagent config check` prints)."""
    doc: dict[str, Any] = {"version": VERSION}
    for name in GROUPS:
        group = getattr(settings, name)
        doc[name] = {s.key: _plain(getattr(group, s.field)) for s in SPECS if s.group == name}
    return doc


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
assert all(_ENV_NAME.match(v) for s in SPECS for v in s.env)
assert len(BY_KEY) == len(SPECS)
