"""mig-parted's v1 MIG config format: strict parsing with file:line:col in every error. Pure.

    version: v1
    mig-configs:
      NAME:
        - devices: all | [0, 1]          # required
          device-filter: "0x233510DE"    # optional: PCI device ids, "0xDEVICE[:0xSUBSYSTEM]"
          mig-enabled: true | false      # required
          mig-devices: {"1g.18gb": 2}    # profile -> count; required when enabled, empty
                                         # when disabled; profiles: nodeagent.mig.profile

All errors of a file are collected and raised together as one ConfigError.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import yaml

from nodeagent.base.configfile import (
    STANDARD_TAG,
    Errors,
    Mark,
    check_tags,
    compose,
    kind,
    mapping,
    read_text,
    scalar,
)
from nodeagent.base.errors import ConfigError
from nodeagent.mig.profile import ProfileFormatError, ProfileName, parse_profile

PCI_ID_RE = re.compile(r"^0x([0-9a-fA-F]{1,8})(?::0x([0-9a-fA-F]{1,8}))?$")
E = TypeVar("E")
ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")


@dataclass(frozen=True)
class ProfileCount:
    name: str  # as written
    count: int
    mark: Mark
    profile: ProfileName


@dataclass(frozen=True)
class DeviceId:
    """A device-filter item: the PCI device id (device << 16 | vendor), and optionally the
    subsystem id, which must then match too (mig-parted's `0xDEVICE:0xSUBSYSTEM`)."""

    device: int
    subsystem: int | None = None

    def matches(self, device: int, subsystem: int) -> bool:
        return device == self.device and self.subsystem in (None, subsystem)


@dataclass(frozen=True)
class Entry:
    devices: Literal["all"] | tuple[int, ...]
    device_filter: tuple[DeviceId, ...] | None
    mig_enabled: bool
    mig_devices: tuple[ProfileCount, ...]
    mark: Mark
    devices_mark: Mark


@dataclass(frozen=True)
class MigConfigFile:
    source: str
    configs: dict[str, tuple[Entry, ...]]
    marks: dict[str, Mark] = field(default_factory=dict)


def parse_config(text: str, source: str) -> MigConfigFile:
    """Parse a v1 MIG config file; raise ConfigError listing every problem with its position."""
    errors = Errors(source)
    root = compose(text, source, "'version: v1' and 'mig-configs'")
    check_tags(root, errors)
    if not isinstance(root, yaml.MappingNode):
        errors.add(root, f"the file must be a mapping, not {kind(root)}")
        errors.raise_if_any()
    top = dict((k.value, (k, v)) for k, v in mapping(root, errors, "the file"))
    for key, (knode, _) in top.items():
        if key not in ("version", "mig-configs"):
            errors.add(knode, f"unknown key {key!r}; expected 'version' and 'mig-configs'")
    if "version" not in top:
        errors.add(root, "missing 'version: v1'")
    else:
        vnode = top["version"][1]
        if not (isinstance(vnode, yaml.ScalarNode) and vnode.value == "v1"):
            errors.add(vnode, f"version must be v1, not {kind(vnode)}")
    configs: dict[str, tuple[Entry, ...]] = {}
    marks: dict[str, Mark] = {}
    if "mig-configs" not in top:
        if not any(k not in ("version", "mig-configs") for k in top):
            errors.add(root, "missing 'mig-configs'")
    else:
        cnode = top["mig-configs"][1]
        pairs = mapping(cnode, errors, "mig-configs")
        if isinstance(cnode, yaml.MappingNode) and not pairs and not cnode.value:
            errors.add(cnode, "mig-configs is empty; define at least one config")
        for knode, vnode in pairs:
            marks[knode.value] = errors.mark(knode)
            configs[knode.value] = _entries(vnode, errors, f"config {knode.value!r}")
    errors.raise_if_any()
    return MigConfigFile(source, configs, marks)


def load_config(path: str | None) -> MigConfigFile:
    """Read and parse a v1 config file (`-` reads stdin). Raises ConfigError (no path, a file
    that cannot be read (nodeagent.base.configfile), or every problem in it)."""
    if not path:
        raise ConfigError("no MIG config file: pass -f FILE or set NODEAGENT_MIG_CONFIG_FILE")
    return parse_config(
        read_text(path, "MIG config file", pipe=True), "<stdin>" if path == "-" else path
    )


def _entries(node: yaml.Node, errors: Errors, what: str) -> tuple[Entry, ...]:
    return _entry_list(node, errors, what, _entry)


def _entry_list(
    node: yaml.Node,
    errors: Errors,
    what: str,
    parse_entry: Callable[[yaml.Node, Errors, str], E | None],
) -> tuple[E, ...]:
    """A config's list of entries, each read by `parse_entry` (MIG and sharing configs)."""
    if not isinstance(node, yaml.SequenceNode):
        errors.add(node, f"{what} must be a list of entries (- devices: ...), not {kind(node)}")
        return ()
    if not node.value:
        errors.add(node, f"{what} has no entries")
    entries = []
    for i, item in enumerate(node.value):
        entry = parse_entry(item, errors, f"{what} entry {i + 1}")
        if entry is not None:
            entries.append(entry)
    return tuple(entries)


def _entry(node: yaml.Node, errors: Errors, what: str) -> Entry | None:
    before = len(errors.located)
    if not isinstance(node, yaml.MappingNode):
        errors.add(
            node, f"{what} must be a mapping (devices: ..., mig-enabled: ...), not {kind(node)}"
        )
        return None
    fields = dict((k.value, (k, v)) for k, v in mapping(node, errors, what))
    for key, (knode, _) in fields.items():
        if key not in ENTRY_KEYS:
            errors.add(
                knode, f"{what}: unknown key {key!r}; expected one of {', '.join(ENTRY_KEYS)}"
            )
    devices = _devices(fields, node, errors, what)
    device_filter = _device_filter(fields, errors, what)
    enabled = None
    if "mig-enabled" not in fields:
        errors.add(node, f"{what}: missing 'mig-enabled' (true or false)")
    else:
        enode = fields["mig-enabled"][1]
        value = go_scalar(enode)
        if not isinstance(value, bool):
            errors.add(enode, f"{what}: mig-enabled must be true or false, not {kind(enode)}")
        else:
            enabled = value
    counts = _mig_devices(fields, errors, what)
    if enabled is True and "mig-devices" not in fields:
        errors.add(
            node,
            f"{what}: mig-enabled is true but mig-devices is missing; write mig-devices: {{}}"
            " for MIG without slices",
        )
    if enabled is False and counts:
        errors.add(
            fields["mig-devices"][1], f"{what}: mig-devices must be empty when mig-enabled is false"
        )
    if len(errors.located) > before or devices is None or enabled is None:
        return None
    return Entry(
        devices=devices,
        device_filter=device_filter,
        mig_enabled=enabled,
        mig_devices=counts,
        mark=errors.mark(node),
        devices_mark=errors.mark(fields["devices"][1]),
    )


def _devices(
    fields: dict[str, tuple[yaml.Node, yaml.Node]], node: yaml.Node, errors: Errors, what: str
) -> Literal["all"] | tuple[int, ...] | None:
    if "devices" not in fields:
        errors.add(node, f"{what}: missing 'devices' ('all' or a list of GPU indices)")
        return None
    dnode = fields["devices"][1]
    if isinstance(dnode, yaml.ScalarNode) and dnode.value == "all":
        return "all"
    if isinstance(dnode, yaml.SequenceNode) and not dnode.value:
        return ()  # mig-parted takes it: an entry for no GPU
    if not isinstance(dnode, yaml.SequenceNode):
        errors.add(
            dnode, f"{what}: devices must be 'all' or a list of GPU indices, not {kind(dnode)}"
        )
        return None
    indices: list[int] = []
    for item in dnode.value:
        value = go_int(item)
        if value is None or value < 0:
            errors.add(item, f"{what}: device index must be an integer >= 0, not {kind(item)}")
        elif value not in indices:  # listed twice: mig-parted takes it, one GPU
            indices.append(value)
    return tuple(indices)


def _device_filter(
    fields: dict[str, tuple[yaml.Node, yaml.Node]], errors: Errors, what: str
) -> tuple[DeviceId, ...] | None:
    if "device-filter" not in fields:
        return None
    fnode = fields["device-filter"][1]
    items = fnode.value if isinstance(fnode, yaml.SequenceNode) else [fnode]
    if isinstance(fnode, yaml.SequenceNode) and not items:
        errors.add(fnode, f"{what}: device-filter is an empty list")
    ids = []
    for item in items:
        m = PCI_ID_RE.match(item.value) if isinstance(item, yaml.ScalarNode) else None
        if m is None:
            errors.add(
                item,
                f"{what}: device-filter must be a PCI device id like '0x233510DE' (optionally"
                f" with ':0x' and a subsystem id), not {kind(item)}",
            )
        else:
            sub = m.group(2)
            ids.append(DeviceId(int(m.group(1), 16), int(sub, 16) if sub is not None else None))
    return tuple(ids)


def _mig_devices(
    fields: dict[str, tuple[yaml.Node, yaml.Node]], errors: Errors, what: str
) -> tuple[ProfileCount, ...]:
    if "mig-devices" not in fields:
        return ()
    mnode = fields["mig-devices"][1]
    if isinstance(mnode, yaml.ScalarNode) and scalar(mnode) is None:
        # mig-parted reads an empty value as no slices: fine where MIG is off, missing where on
        enabled = go_scalar(fields["mig-enabled"][1]) if "mig-enabled" in fields else None
        if enabled is not False:
            errors.add(mnode, f"{what}: mig-devices is empty; write {{}} for no slices")
        return ()
    counts: list[ProfileCount] = []
    seen: dict[ProfileName, str] = {}
    for knode, vnode in mapping(mnode, errors, f"{what} mig-devices"):
        name = str(knode.value)
        try:
            profile = parse_profile(name)
        except ProfileFormatError as err:
            shown = repr(name) if len(name) <= 64 else repr(name[:60]) + "..."
            errors.add(
                knode,
                f"{what}: {shown} is not a MIG profile name like '1g.18gb', '1g.18gb+me' or"
                f" '1c.3g.71gb': {err}",
            )
            continue
        if profile in seen:
            errors.add(knode, f"{what}: {name!r} names the same profile as {seen[profile]!r}")
            continue
        seen[profile] = name
        value = go_int(vnode)
        if value is None or value < 0:
            errors.add(vnode, f"{what}: count of {name} must be an integer >= 0, not {kind(vnode)}")
            continue
        counts.append(ProfileCount(name, value, errors.mark(knode), profile))
    return tuple(counts)


# YAML 1.1 as go-yaml v2 (under mig-parted's sigs.k8s.io/yaml) resolves plain scalars where
# PyYAML does not: y/n are booleans, 1e3 is a number.
GO_BOOLS = {"y": True, "Y": True, "n": False, "N": False}
GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


def go_scalar(node: yaml.Node) -> Any:
    """A scalar's value as mig-parted's parser reads it (None for a list or a mapping)."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    value = scalar(node)
    if isinstance(value, str) and not node.style and node.tag == STANDARD_TAG + "str":
        if value in GO_BOOLS:
            return GO_BOOLS[value]
        if GO_FLOAT.match(value):
            return float(value)
    return value


def go_int(node: yaml.Node) -> int | None:
    """An integer as mig-parted takes one (JSON's number: 7, 0x7, 7.0 or 7e0), else None."""
    value = go_scalar(node)
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value if isinstance(value, int) else None


def dump_config(configs: dict[str, list[dict[str, Any]]]) -> str:
    """Write configs as a v1 file (what `mig export` and `mig generate-config` print)."""
    return yaml.safe_dump(
        {"version": "v1", "mig-configs": configs}, sort_keys=False, default_flow_style=False
    )
