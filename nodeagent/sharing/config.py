"""The nodeagent/v1 sharing config: how each GPU is shared. Strict, file:line:col in every error.

    version: nodeagent/v1
    sharing-configs:
      NAME:
        - devices: all | [0, 1]           # required
          device-filter: "0x233510DE"     # optional: a PCI device id or a list of them
          mig: {mig-devices: {"1g.18gb": 4}}   # or {mig-config: all-balanced}
        - devices: [2, 3]
          mps: {replicas: 4, thread-percentage: 25, pinned-memory: 32G}
        - devices: [4]
          time-slicing: {replicas: 4}
        - devices: [5]
          whole: {}

Each entry has exactly one of mig, mps, time-slicing, whole. A mig-parted v1 file (`version: v1`,
`mig-configs`) is read as "MIG only": mig-enabled entries become mig entries, the others whole.
All errors of a file are collected and raised together as one ConfigError. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import yaml

from nodeagent.base.configfile import Errors as _Errors
from nodeagent.base.configfile import Mark, compose
from nodeagent.base.configfile import check_tags as _check_tags
from nodeagent.base.configfile import kind as _kind
from nodeagent.base.configfile import mapping as _mapping
from nodeagent.base.configfile import read_text as read_config_text
from nodeagent.base.configfile import scalar as _scalar
from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import (
    DeviceId,
    MigConfigFile,
    ProfileCount,
    _device_filter,
    _devices,
    _entry_list,
    _mig_devices,
    go_int,
    parse_config,
)
from nodeagent.mps.settings import parse_size

VERSION = "nodeagent/v1"
STRATEGIES = ("mig", "mps", "time-slicing", "whole")
ENTRY_KEYS = ("devices", "device-filter", *STRATEGIES)
MIG_KEYS = ("mig-devices", "mig-config")
MPS_KEYS = ("replicas", "thread-percentage", "pinned-memory")
# Replicas per GPU, bounded where they are read: every replica is a device the device plugin
# advertises to the kubelet and a label value (at most 63 characters). An MPS client gets at
# least 1 % of the SMs (thread percentage 1-100); time-slicing has no hardware bound, 1,024
# clients taking turns on one GPU is far past any useful share.
MAX_MPS_REPLICAS = 100
MAX_TIME_SLICING_REPLICAS = 1024

Fields = dict[str, tuple[yaml.Node, yaml.Node]]


@dataclass(frozen=True)
class MigShare:
    """MIG slices: either profile counts, or the name of a config of a mig-parted v1 file."""

    profiles: tuple[ProfileCount, ...] | None
    mig_config: str | None


@dataclass(frozen=True)
class MpsShare:
    replicas: int
    thread_percentage: int | None
    pinned_memory: str | None  # size text as written ("32G"); checked by parse_size


@dataclass(frozen=True)
class TimeSlicing:
    replicas: int


@dataclass(frozen=True)
class Whole:
    pass


Share = MigShare | MpsShare | TimeSlicing | Whole


@dataclass(frozen=True)
class SharingEntry:
    devices: Literal["all"] | tuple[int, ...]
    device_filter: tuple[DeviceId, ...] | None
    share: Share
    mark: Mark
    devices_mark: Mark


@dataclass(frozen=True)
class SharingFile:
    source: str
    configs: dict[str, tuple[SharingEntry, ...]]
    mig_parted: bool  # read from a mig-parted v1 file: MIG only


def parse_sharing(text: str, source: str) -> SharingFile:
    """Parse a nodeagent/v1 sharing file, or a mig-parted v1 file as MIG only. Raises
    ConfigError listing every problem with its position."""
    root = compose(text, source, f"'version: {VERSION}' and 'sharing-configs'")
    if _is_mig_parted(root):
        return from_mig_parted(parse_config(text, source))
    errors = _Errors(source)
    _check_tags(root, errors)
    if not isinstance(root, yaml.MappingNode):
        errors.add(root, f"the file must be a mapping, not {_kind(root)}")
        errors.raise_if_any()
    top = _fields(root, errors, "the file", ("version", "sharing-configs"))
    if "version" not in top:
        errors.add(root, f"missing 'version: {VERSION}'")
    else:
        vnode = top["version"][1]
        if not (isinstance(vnode, yaml.ScalarNode) and vnode.value == VERSION):
            errors.add(
                vnode,
                f"version must be {VERSION} (or v1 for a mig-parted MIG config),"
                f" not {_kind(vnode)}",
            )
    configs: dict[str, tuple[SharingEntry, ...]] = {}
    if "sharing-configs" not in top:
        if set(top) <= {"version"}:  # an unknown key may be its misspelling: said already
            errors.add(root, "missing 'sharing-configs'")
    else:
        cnode = top["sharing-configs"][1]
        pairs = _mapping(cnode, errors, "sharing-configs")
        if isinstance(cnode, yaml.MappingNode) and not cnode.value:
            errors.add(cnode, "sharing-configs is empty; define at least one config")
        for knode, vnode in pairs:
            configs[knode.value] = _entries(vnode, errors, f"config {knode.value!r}")
    errors.raise_if_any()
    return SharingFile(source, configs, mig_parted=False)


def from_mig_parted(cfg: MigConfigFile) -> SharingFile:
    """A mig-parted v1 file as sharing configs: MIG enabled -> mig entry, disabled -> whole."""
    configs = {
        name: tuple(
            SharingEntry(
                e.devices,
                e.device_filter,
                MigShare(e.mig_devices, None) if e.mig_enabled else Whole(),
                e.mark,
                e.devices_mark,
            )
            for e in entries
        )
        for name, entries in cfg.configs.items()
    }
    return SharingFile(cfg.source, configs, mig_parted=True)


def _is_mig_parted(root: yaml.Node) -> bool:
    if not isinstance(root, yaml.MappingNode):
        return False
    return any(
        isinstance(k, yaml.ScalarNode)
        and k.value == "version"
        and isinstance(v, yaml.ScalarNode)
        and v.value == "v1"
        for k, v in root.value
    )


def _fields(node: yaml.Node, errors: _Errors, what: str, allowed: tuple[str, ...]) -> Fields:
    """The mapping's keys with their nodes; unknown keys are errors at the key."""
    fields = {k.value: (k, v) for k, v in _mapping(node, errors, what)}
    for key, (knode, _) in fields.items():
        if key not in allowed:
            expected = ", ".join(repr(a) for a in allowed)
            errors.add(knode, f"{what}: unknown key {key!r}; expected one of {expected}")
    return fields


def _entries(node: yaml.Node, errors: _Errors, what: str) -> tuple[SharingEntry, ...]:
    return _entry_list(node, errors, what, _entry)


def _entry(node: yaml.Node, errors: _Errors, what: str) -> SharingEntry | None:
    before = len(errors.located)
    if not isinstance(node, yaml.MappingNode):
        errors.add(node, f"{what} must be a mapping (devices: ..., mps: ...), not {_kind(node)}")
        return None
    fields = _fields(node, errors, what, ENTRY_KEYS)
    devices = _devices(fields, node, errors, what)
    if devices is not None and devices != "all":
        _no_repeats(fields["devices"][1], errors, what)
    device_filter = _device_filter(fields, errors, what)
    given = [key for key in fields if key in STRATEGIES]
    share: Share | None = None
    if not given:
        errors.add(node, f"{what}: missing the sharing: give one of {', '.join(STRATEGIES)}")
    for extra in given[1:]:
        errors.add(
            fields[extra][0],
            f"{what}: has both {given[0]!r} and {extra!r}; give exactly one of"
            f" {', '.join(STRATEGIES)}",
        )
    if len(given) == 1:
        share = _share(given[0], fields[given[0]][1], errors, f"{what} {given[0]}")
    if len(errors.located) > before or devices is None or share is None:
        return None
    return SharingEntry(
        devices, device_filter, share, errors.mark(node), errors.mark(fields["devices"][1])
    )


def _no_repeats(dnode: yaml.Node, errors: _Errors, what: str) -> None:
    """A GPU listed twice in one entry is a slip in this format (mig-parted's v1 takes it as
    one GPU, and a v1 file read as a sharing config still does)."""
    seen: set[int] = set()
    for item in dnode.value:
        index = go_int(item)
        if index is not None and index in seen:
            errors.add(item, f"{what}: devices lists GPU {index} twice")
        elif index is not None:
            seen.add(index)


def _share(key: str, node: yaml.Node, errors: _Errors, what: str) -> Share | None:
    if key == "mig":
        return _mig(node, errors, what)
    if key == "whole":
        if not (_is_null(node) or (isinstance(node, yaml.MappingNode) and not node.value)):
            _fields(node, errors, what, ())
            if not isinstance(node, yaml.MappingNode):
                return None
        return Whole()
    allowed = MPS_KEYS if key == "mps" else ("replicas",)
    fields = _fields(node, errors, what, allowed)
    if not isinstance(node, yaml.MappingNode):
        return None
    most = MAX_MPS_REPLICAS if key == "mps" else MAX_TIME_SLICING_REPLICAS
    replicas = _int(fields, "replicas", node, errors, what, 2, most, required=True)
    if key == "time-slicing":
        return TimeSlicing(replicas) if replicas is not None else None
    percentage = _int(fields, "thread-percentage", node, errors, what, 1, 100, required=False)
    pinned = _size(fields, errors, what)
    if replicas is None:
        return None
    return MpsShare(replicas, percentage, pinned)


def _mig(node: yaml.Node, errors: _Errors, what: str) -> MigShare | None:
    fields = _fields(node, errors, what, MIG_KEYS)
    if not isinstance(node, yaml.MappingNode):
        return None
    if ("mig-devices" in fields) == ("mig-config" in fields):
        errors.add(
            node,
            f"{what}: give exactly one of 'mig-devices' (profile: count) or 'mig-config'"
            " (a config of the MIG config file)",
        )
        return None
    if "mig-devices" in fields:
        return MigShare(_mig_devices(fields, errors, what), None)
    cnode = fields["mig-config"][1]
    name = _scalar(cnode) if isinstance(cnode, yaml.ScalarNode) else None
    if not isinstance(name, str) or not name:
        errors.add(cnode, f"{what}: mig-config must be a config name, not {_kind(cnode)}")
        return None
    return MigShare(None, name)


def _int(
    fields: Fields,
    key: str,
    node: yaml.Node,
    errors: _Errors,
    what: str,
    low: int,
    high: int | None,
    *,
    required: bool,
) -> int | None:
    if key not in fields:
        if required:
            errors.add(node, f"{what}: missing {key!r} (an integer >= {low})")
        return None
    vnode = fields[key][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    bounds = f"{low}-{high}" if high is not None else f">= {low}"
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        errors.add(vnode, f"{what}: {key} must be an integer {bounds}, not {_kind(vnode)}")
        return None
    return value


def _size(fields: Fields, errors: _Errors, what: str) -> str | None:
    if "pinned-memory" not in fields:
        return None
    vnode = fields["pinned-memory"][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    text = vnode.value.strip() if isinstance(vnode, yaml.ScalarNode) else ""
    try:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ConfigError(f"pinned-memory must be a size like 2G or 2048M, not {_kind(vnode)}")
        size = parse_size(text, "pinned-memory")
    except ConfigError as err:
        errors.add(vnode, f"{what}: {err}")
        return None
    if size < 1 << 20:
        errors.add(
            vnode, f"{what}: pinned-memory {text} is under 1 MiB; the daemon takes whole MiB"
        )
        return None
    return text


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and _scalar(node) is None


def load_sharing_file(path: str | None) -> SharingFile:
    """Read and parse a sharing config file (`-` reads stdin). Raises ConfigError."""
    if not path:
        raise ConfigError("no sharing config file: pass --sharing-file FILE")
    text = read_config_text(path, "sharing config file", pipe=True)
    return parse_sharing(text, "<stdin>" if path == "-" else path)
