"""NVIDIA's device plugin config, read as GPU Feature Discovery reads it for its labels.

Where users keep the plugin's own sharing config (a file, or the Helm chart's / operator's
ConfigMap of named configs chosen per node by the label `nvidia.com/device-plugin.config`),
the labels follow it: `labels.device-plugin-config-file` is GFD's --config-file;
`labels.device-plugin-config-dir`, `-default-config`, `-fallback-strategies` and
`-config-label` are config-manager's CONFIG_FILE_SRCDIR, DEFAULT_CONFIG, FALLBACK_STRATEGIES
and NODE_LABEL (k8s-device-plugin cmd/config-manager, 1b826acc), so nodeagent picks the config
the plugin runs with. Parsed as the plugin parses it (api/config/v1): unknown keys are the
plugin's business, but a value the plugin would refuse is an error at its file:line:col.
(nodeagent.sharing.deviceplugin writes this format for nodeagent's own sharing; nodeagent.mps.layout
reads its MPS part for the daemon. This reader is the labels' own.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from nodeagent.base.configfile import ConfigCache, Errors, compose, kind, mapping, read_text, scalar
from nodeagent.base.errors import ConfigError
from nodeagent.labels.gfd import STRATEGIES
from nodeagent.labels.replication import ResourceSharing
from nodeagent.settings import Labels

RESOURCE_PREFIX = "nvidia.com/"
NAMED_FALLBACK = "default"  # config-manager's `named` fallback
WHAT = "device plugin config"


@dataclass(frozen=True)
class DevicePluginConfig:
    """What of the plugin's config shapes GFD's labels."""

    sharing: ResourceSharing
    mig_strategy: str | None  # flags.migStrategy; None: not given
    source: str  # the file read ("" for config-manager's empty config)


EMPTY = DevicePluginConfig(ResourceSharing(), None, "")


def _resource_key(node: yaml.Node, errors: Errors, where: str) -> str | None:
    """A resource name as the plugin takes it (`gpu` is `nvidia.com/gpu`), without the prefix."""
    value = scalar(node)
    name = value.removeprefix(RESOURCE_PREFIX) if isinstance(value, str) else ""
    if not name or "/" in name or len(RESOURCE_PREFIX + name) > 63:
        errors.add(
            node, f"{where}.name must be a resource name like nvidia.com/gpu, not {kind(node)}"
        )
        return None
    return name


def _devices_ok(node: yaml.Node) -> bool:
    value = scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return all(isinstance(scalar(n), (int, str)) for n in node.value)
    if isinstance(value, bool):
        return False
    return value == "all" or (isinstance(value, int) and value > 0)


def _resource(node: yaml.Node, errors: Errors, where: str) -> tuple[str, int] | None:
    fields = {k.value: v for k, v in mapping(node, errors, where)}
    for required in ("name", "replicas"):
        if required not in fields:
            errors.add(node, f"{where} has no {required}")
    if "devices" in fields and not _devices_ok(fields["devices"]):
        errors.add(fields["devices"], f"{where}.devices must be 'all', a count > 0 or a list")
    if "rename" in fields and not isinstance(scalar(fields["rename"]), str):
        errors.add(fields["rename"], f"{where}.rename must be a resource name")
    name = _resource_key(fields["name"], errors, where) if "name" in fields else None
    replicas = scalar(fields["replicas"]) if "replicas" in fields else None
    if "replicas" in fields and (
        isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2
    ):
        errors.add(fields["replicas"], f"{where}.replicas must be a number >= 2")
        return None
    return (name, replicas) if name is not None and isinstance(replicas, int) else None


def _replicated(node: yaml.Node, errors: Errors, where: str) -> tuple[dict[str, int], bool]:
    """(replicas by resource, renameByDefault) of sharing.timeSlicing or sharing.mps."""
    fields = {k.value: v for k, v in mapping(node, errors, where)}
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in fields and not isinstance(scalar(fields[flag]), bool):
            errors.add(fields[flag], f"{where}.{flag} must be true or false")
    resources = fields.get("resources")
    if not isinstance(resources, yaml.SequenceNode) or not resources.value:
        errors.add(resources or node, f"{where}.resources must list at least one resource")
        return {}, False
    replicas: dict[str, int] = {}
    for i, item in enumerate(resources.value):
        found = _resource(item, errors, f"{where}.resources[{i}]")
        if found is not None:
            replicas[found[0]] = found[1]
    rename = fields.get("renameByDefault")
    return replicas, rename is not None and scalar(rename) is True


def parse_plugin_config(text: str, source: str) -> DevicePluginConfig:
    """The plugin config in `text`. An empty file is the plugin's empty config (no sharing).
    Raises ConfigError naming file:line:col of every problem."""
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        return DevicePluginConfig(ResourceSharing(), None, source)
    root = compose(text, source, "a device plugin config (version: v1)")
    errors = Errors(source)
    top = {k.value: v for k, v in mapping(root, errors, WHAT)}
    if "version" in top and scalar(top["version"]) != "v1":
        errors.add(top["version"], f"unknown version {kind(top['version'])}; the plugin reads v1")
    mig_strategy = None
    flags = (
        {k.value: v for k, v in mapping(top["flags"], errors, "flags")} if "flags" in top else {}
    )
    if "migStrategy" in flags:
        mig_strategy = scalar(flags["migStrategy"])
        if mig_strategy not in STRATEGIES:
            errors.add(flags["migStrategy"], "flags.migStrategy must be none, single or mixed")
    sharing = (
        {k.value: v for k, v in mapping(top["sharing"], errors, "sharing")}
        if "sharing" in top
        else {}
    )
    parts = {
        key: _replicated(sharing[key], errors, f"sharing.{key}")
        for key in ("mps", "timeSlicing")
        if key in sharing
    }
    errors.raise_if_any()
    # GFD: the MPS resources when MPS is configured, else the time-sliced ones.
    chosen = "mps" if "mps" in parts else "timeSlicing" if "timeSlicing" in parts else None
    if chosen is None:
        return DevicePluginConfig(ResourceSharing(), mig_strategy, source)
    replicas, renamed = parts[chosen]
    strategy = "mps" if chosen == "mps" else "time-slicing"
    return DevicePluginConfig(ResourceSharing(strategy, replicas, renamed), mig_strategy, source)


def load_plugin_config(path: str | None) -> DevicePluginConfig:
    """Read and parse the plugin config at `path` (bounded: nodeagent.base.configfile)."""
    if not path:
        return EMPTY
    if os.path.realpath(path) == os.devnull:  # config-manager's empty config: a link to it
        return DevicePluginConfig(ResourceSharing(), None, path)
    return parse_plugin_config(read_text(path, WHAT), path)


def _named_configs(folder: Path) -> list[str]:
    """The configs a mounted ConfigMap offers: its files, not its `..data` bookkeeping."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise ConfigError(
            f"cannot read the device plugin config folder {folder}: {err.strerror}"
        ) from err
    return [e.name for e in entries if not e.name.startswith("..") and not _is_dir(e)]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A folder (a link to one too); an entry that cannot be looked at (a loop of links) is
    no folder: offered, and refused with its reason once chosen."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def choose(settings: Labels, label_value: str | None) -> str | None:
    """The file of the config the plugin runs with; None for no config or the empty one.
    The folder's config is the one the node label names, else the default, else the first
    fallback that finds one (config-manager's rules). Raises ConfigError where config-manager
    would fail (a name it does not have, no config found)."""
    if settings.device_plugin_config_file is not None:
        return str(settings.device_plugin_config_file)
    folder = settings.device_plugin_config_dir
    if folder is None:
        return None
    names = _named_configs(folder)
    if not names:
        raise ConfigError(f"the device plugin config folder {folder} holds no config")
    label = settings.device_plugin_config_label
    for wanted, why in (
        (label_value, f"the node label {label}"),
        (settings.device_plugin_default_config, "labels.device-plugin-default-config"),
    ):
        if wanted:
            if wanted not in names:
                raise ConfigError(
                    f"{why} names device plugin config {wanted!r}, which {folder} does not"
                    f" hold (it holds {', '.join(names)})"
                )
            return str(folder / wanted)
    for fallback in settings.device_plugin_fallback_strategies:
        if fallback == "named" and NAMED_FALLBACK in names:
            return str(folder / NAMED_FALLBACK)
        if fallback == "single" and len(names) == 1:
            return str(folder / names[0])
        if fallback == "empty":
            return None
    tried = ", ".join(settings.device_plugin_fallback_strategies) or "none"
    raise ConfigError(
        f"no device plugin config is chosen in {folder}: no node label {label}, no"
        f" labels.device-plugin-default-config, and no fallback ({tried}) finds one"
    )


class DevicePluginConfigReader:
    """The plugin config for the node now: chosen again at every call (the label may have
    changed), parsed again only when its file changed."""

    def __init__(self) -> None:
        self.files = ConfigCache[DevicePluginConfig](load_plugin_config, WHAT)

    def read(self, settings: Labels, label_value: str | None) -> DevicePluginConfig | None:
        """None where no plugin config is set. Raises ConfigError (one sentence, file:line)."""
        if settings.device_plugin_config_file is None and settings.device_plugin_config_dir is None:
            return None
        path = choose(settings, label_value)
        return self.files.load(path) if path else EMPTY
