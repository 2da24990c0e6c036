"""Every setting of nodeagent, in one place: grouped frozen dataclasses and one loader.

Precedence, lowest first: the defaults below -> the settings file (`--config FILE`,
`NODEAGENT_CONFIG`) -> the environment (`NODEAGENT_*`) -> command-line flags. Every setting has
exactly one row in `SPECS`: its file key, its environment variable(s), its flag, its parser and
whether a reload (SIGHUP) may change it while the agent runs ("hot") or only a restart may.

Values are parsed and checked inside `load()`, never while the argument parser is built, so a
bad `NODEAGENT_MPS_REPLICAS` fails only the commands that use it, with one sentence naming the
variable. Every error of every source is collected and raised together as one ConfigError.

    version: nodeagent/v1
    metrics: {address: "0.0.0.0:9401", refresh-interval: 5, gpm-interval: 1}
    reconcile: {interval: 30}
    mig: {config-file: /etc/nodeagent/mig.yaml, config: all-balanced}
    mps: {enabled: true, replicas: 4}
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nodeagent.errors import ConfigError

if TYPE_CHECKING:
    from nodeagent.mps.settings import MpsSettings

VERSION = "nodeagent/v1"
DEFAULT_METRICS_ADDRESS = "0.0.0.0:9401"  # dcgm-exporter keeps 9400: both can run on a node
DEFAULT_LABEL_PREFIX = "nvidia.com/"
DEFAULT_MPS_ROOT = Path("/run/nvidia/mps")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_RUN_DIR = Path("/run/nodeagent")
MAX_ERRORS = 20


@dataclass(frozen=True)
class Node:
    """Where nodeagent runs: the emulator instead of NVML, its run directory, logging."""

    simulate: str | None = None
    sim_state: Path | None = None
    run_dir: Path = DEFAULT_RUN_DIR
    log_level: str = "warning"
    log_format: str = "auto"
    nvml_wait_seconds: float = 0.0  # `run` only: how long to wait for NVML at start


@dataclass(frozen=True)
class Metrics:
    address: str = DEFAULT_METRICS_ADDRESS
    refresh_interval_seconds: float = 5.0
    gpm_interval_seconds: float = 1.0


@dataclass(frozen=True)
class Reconcile:
    interval_seconds: float = 30.0


@dataclass(frozen=True)
class Mig:
    config_file: str | None = None
    config: str | None = None
    reset_command: str | None = None  # None: `nvidia-smi -r -i {index}` (the emulator's reset)
    lock_timeout_seconds: float = 60.0
    hooks_file: str | None = None  # mig-parted's hooks file (v1): commands around a change
    hook_timeout_seconds: float = 300.0


@dataclass(frozen=True)
class Sharing:
    """The per-GPU sharing config (nodeagent/v1): MIG here, MPS there, time-slicing elsewhere."""

    config_file: str | None = None
    config: str | None = None
    plugin_config_out: Path | None = None  # write NVIDIA's device plugin config here
    workload_file: str | None = None  # plan the sharing from this workload file (nodeagent.plan)


@dataclass(frozen=True)
class Labels:
    prefix: str = DEFAULT_LABEL_PREFIX
    nfd_features_file: Path | None = None
    mig_strategy: str = "mixed"  # GFD's --mig-strategy: none, single or mixed
    machine_type_file: Path = Path("/sys/class/dmi/id/product_name")  # gpu.machine (GFD's)


@dataclass(frozen=True)
class Mps:
    enabled: bool = False
    devices: tuple[int, ...] | None = None  # None: every GPU left without MIG
    replicas: int = 2
    thread_percentage: int | None = None  # None: 100 // replicas
    pinned_memory: str | None = None  # SIZE or INDEX=SIZE,...; None: memory / replicas
    layout: str = "auto"  # device-plugin with Kubernetes, flat without (nodeagent.mps.layout)
    root: Path = DEFAULT_MPS_ROOT
    device_plugin_config: Path | None = None  # the plugin's config: resource name, replicas
    shm_size: str | None = None  # device-plugin layout: <root>/shm tmpfs; None: half the memory
    pipe_dir: Path | None = None  # None: from the layout
    log_dir: Path | None = None
    ready_file: Path | None = None
    control: str = "nvidia-cuda-mps-control"
    exclusive_process: bool | None = None  # None: on with the device-plugin layout
    probe_interval_seconds: float = 5.0
    stop_on_exit: bool = False


# What mig-manager pauses around a MIG change (mig-parted pkg/mig/reconfigure): the GPU
# operator's deploy labels nvidia.com/gpu.deploy.<name>; `client` only where the node has it.
DEFAULT_PAUSE_COMPONENTS = (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm", "client",
)  # fmt: skip
DEFAULT_MIG_CONFIG_LABEL = "nvidia.com/mig.config"


@dataclass(frozen=True)
class Kube:
    enabled: bool = False
    node_name: str | None = None
    kubeconfig: str | None = None
    host: str | None = None
    # component -> selector of pods to wait for ({}: only DaemonSet pods selecting its label)
    pause_components: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {name: {} for name in DEFAULT_PAUSE_COMPONENTS}
    )
    restart_pods: tuple[Mapping[str, str], ...] = ()
    clients_wait_seconds: float = 300.0
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET
    watch_timeout_seconds: float = 60.0
    mig_config_label: str = DEFAULT_MIG_CONFIG_LABEL  # state: <label>.state
    node_feature_api: bool = False  # publish an NFD NodeFeature object too
    pod_namespace: str | None = None  # the downward API: the NodeFeature's namespace
    pod_name: str | None = None  # its owner
    pod_uid: str | None = None


DEFAULT_DRA_DRIVER = "gpu.nodeagent.io"
DEFAULT_KUBELET_PLUGINS = Path("/var/lib/kubelet/plugins")


@dataclass(frozen=True)
class Dra:
    """nodeagent as a Kubernetes DRA driver (kubelet plugin), beside the device-plugin path."""

    enabled: bool = False
    driver: str = DEFAULT_DRA_DRIVER
    plugin_dir: Path | None = None  # None: /var/lib/kubelet/plugins/<driver>
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Path = Path("/var/run/cdi")
    devices: tuple[int, ...] | None = None  # the GPUs DRA manages; None: every GPU

    @property
    def plugin_path(self) -> Path:
        return self.plugin_dir or DEFAULT_KUBELET_PLUGINS / self.driver


@dataclass(frozen=True)
class Settings:
    node: Node = field(default_factory=Node)
    metrics: Metrics = field(default_factory=Metrics)
    reconcile: Reconcile = field(default_factory=Reconcile)
    mig: Mig = field(default_factory=Mig)
    labels: Labels = field(default_factory=Labels)
    mps: Mps = field(default_factory=Mps)
    kube: Kube = field(default_factory=Kube)
    sharing: Sharing = field(default_factory=Sharing)
    dra: Dra = field(default_factory=Dra)
    file: str | None = None  # the settings file read, if any


GROUPS: dict[str, type] = {
    "node": Node,
    "metrics": Metrics,
    "reconcile": Reconcile,
    "mig": Mig,
    "labels": Labels,
    "mps": Mps,
    "kube": Kube,
    "sharing": Sharing,
    "dra": Dra,
}

# -- parsers: raw value (YAML scalar or the text of a variable/flag) -> typed value ----------


class Invalid(ValueError):
    """A value a parser refuses; the message completes 'WHERE: ' (e.g. 'must be > 0')."""


Parser = Callable[[Any], Any]


def _text(raw: Any) -> str:
    if isinstance(raw, (dict, list)) or raw is None or isinstance(raw, bool):
        raise Invalid(f"must be a string, not {_show(raw)}")
    if "\x00" in str(raw):  # no path, name or command may hold a NUL byte
        raise Invalid("must not contain a NUL byte")
    return str(raw)


def _show(raw: Any) -> str:
    if isinstance(raw, dict):
        return "a mapping"
    if isinstance(raw, list):
        return "a list"
    if raw is None:
        return "empty"
    return repr(raw) if isinstance(raw, str) else str(raw)


FLOOR_SECONDS = 0.01  # shorter would spin a core (and hold the NVML lock) for nothing
CEILING_SECONDS = 7 * 86400.0  # longer overflows socket timeouts and is surely a typo


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def seconds(minimum: float = 0.0, inclusive: bool = False) -> Parser:
    """A finite number of seconds above `minimum` (at or above it when `inclusive`), at least
    FLOOR_SECONDS when not 0 and at most CEILING_SECONDS."""

    def parse(raw: Any) -> float:
        if isinstance(raw, bool):
            raise Invalid(f"must be a number of seconds, not {raw}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise Invalid(f"must be a number of seconds, not {_show(raw)}") from None
        bound = f"at least {minimum:g}" if inclusive else f"> {minimum:g}"
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise Invalid(f"must be a finite number of seconds {bound}, not {_show(raw)}")
        if 0 < value < FLOOR_SECONDS:
            raise Invalid(f"must be at least {FLOOR_SECONDS:g} s, not {_show(raw)}")
        if value > CEILING_SECONDS:
            raise Invalid(f"must be at most {CEILING_SECONDS:g} s (7 days), not {_show(raw)}")
        return value

    return parse


def integer(minimum: int, maximum: int | None = None) -> Parser:
    def parse(raw: Any) -> int:
        if isinstance(raw, (bool, float)):
            raise Invalid(f"must be a whole number, not {_show(raw)}")
        digits = str(raw).strip()
        try:
            if not _digits(digits.lstrip("+-")) or len(digits) > 18:
                raise ValueError(digits)
            value = int(digits)
        except ValueError:
            raise Invalid(f"must be a whole number, not {_show(raw)}") from None
        if value < minimum or (maximum is not None and value > maximum):
            span = f"{minimum}-{maximum}" if maximum is not None else f">= {minimum}"
            raise Invalid(f"must be {span}, not {value}")
        return value

    return parse


def optional(parse: Parser) -> Parser:
    """'' (or an empty YAML value) means unset."""

    def parse_optional(raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        return parse(raw)

    return parse_optional


def boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise Invalid(f"must be true or false, not {_show(raw)}")


def text(raw: Any) -> str:
    value = _text(raw).strip()
    if not value:
        raise Invalid("must not be empty")
    return value


def path(raw: Any) -> Path:
    return Path(text(raw))


def choice(*options: str) -> Parser:
    def parse(raw: Any) -> str:
        value = _text(raw).strip().lower()
        if value not in options:
            raise Invalid(f"must be one of {', '.join(options)}, not {_show(raw)}")
        return value

    return parse


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_PREFIX = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def label_prefix(raw: Any) -> str:
    """A Kubernetes label-key prefix: a DNS subdomain (lowercase, at most 253 characters)
    and a '/', e.g. nvidia.com/ or gpu.example.com/."""
    value = text(raw)
    if not _LABEL_PREFIX.match(value) or len(value) > 254:
        raise Invalid(
            f"must be a DNS subdomain followed by '/', e.g. nvidia.com/ or gpu.example.com/,"
            f" not {value!r}"
        )
    return value


def address(raw: Any) -> str:
    value = text(raw)
    try:
        parse_address(value)
    except ConfigError as err:
        raise Invalid(str(err)) from None
    return value


def parse_address(value: str) -> tuple[str, int]:
    """'HOST:PORT', '[IPV6]:PORT' or ':PORT' (all IPv4 interfaces) -> (host, port). HOST may be
    a name, resolved when the server binds. Raises ConfigError naming the value."""
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    host_ok = _is_ipv6(host) if bracketed else not any(c in host for c in ":[] \t")
    if not (sep and host_ok and _digits(port) and int(port) <= 65535):
        raise ConfigError(
            f"metrics address {value!r} must be HOST:PORT, [IPV6]:PORT or :PORT,"
            f" e.g. {DEFAULT_METRICS_ADDRESS}"
        )
    return host or "0.0.0.0", int(port)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def devices(raw: Any) -> tuple[int, ...]:
    items = raw if isinstance(raw, list) else _text(raw).split(",")
    out: list[int] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        if isinstance(item, bool) or not _digits(str(item).strip()):
            raise Invalid(f"must be GPU indices like 0,1, not {_show(raw)}")
        out.append(int(str(item).strip()))
    if not out:
        raise Invalid("must name at least one GPU index")
    if len(set(out)) != len(out):
        raise Invalid(f"lists a GPU twice: {out}")
    return tuple(out)


def size(raw: Any) -> str:
    """A size in the MPS daemon's notation (2G, 2048M, 512MiB), at least 1 MiB."""
    from nodeagent.mps.settings import parse_size

    value = _text(raw).strip()
    try:
        if parse_size(value) < 1 << 20:
            raise Invalid(f"{value!r} is under 1 MiB (the daemon takes whole MiB)")
    except ConfigError:
        raise Invalid(f"{value!r} is not a size like 2G, 2048M or 512MiB") from None
    return value


def pinned_memory(raw: Any) -> str:
    """'2G' or '0=2G,1=4G' (a YAML mapping {0: 2G} too); sizes are checked against the GPUs
    when MPS is resolved."""
    if isinstance(raw, dict):
        parts = []
        for key, value in raw.items():
            if isinstance(key, bool) or not _digits(str(key)):
                raise Invalid(f"keys must be GPU indices, not {_show(key)}")
            parts.append(f"{key}={_text(value).strip()}")
        raw = ",".join(parts)
    value = text(raw)
    seen: set[int] = set()
    parts = value.split(",")
    for part in parts:
        index, sep, amount = part.rpartition("=")
        if (sep and not _digits(index.strip())) or (not sep and len(parts) > 1):
            raise Invalid(f"must be SIZE or INDEX=SIZE,..., not {value!r}")
        if sep and int(index) in seen:
            raise Invalid(f"gives GPU {int(index)} twice: {value!r}")
        seen.add(int(index) if sep else -1)
        size(amount)
    return value


def selector(raw: Any) -> dict[str, str]:
    """'app=x,tier=y' (or a YAML mapping) -> {'app': 'x', 'tier': 'y'}."""
    if isinstance(raw, dict):
        if not raw:
            raise Invalid("selector must not be empty")
        return {text(k): _text(v).strip() for k, v in raw.items()}
    out = {}
    for part in _text(raw).split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise Invalid(f"selector {_show(raw)} must be key=value[,key=value]")
        out[key.strip()] = value.strip()
    return out


def _items(raw: Any) -> list[Any]:
    """A YAML list, or a text of items separated by ';' (a variable) or given one per flag."""
    if isinstance(raw, list):
        return raw
    return [p for p in _text(raw).split(";") if p.strip()]


_COMPONENT = re.compile(r"^[a-z]([-a-z0-9.]*[a-z0-9])?$")
COMPONENT_FORM = "NAME or NAME=KEY=VALUE[,KEY=VALUE]"


def _component(name: Any) -> str:
    value = _text(name).strip()
    if not _COMPONENT.match(value) or len(value) > 40:
        raise Invalid(
            f"component {_show(name)} must be {COMPONENT_FORM}, NAME a lowercase word such as"
            " device-plugin (its label is nvidia.com/gpu.deploy.NAME)"
        )
    return value


def components(raw: Any) -> dict[str, dict[str, str]]:
    """NAME[=SELECTOR] items (';'-separated in a variable, a list or a mapping in a file); an
    empty value pauses nothing."""
    if isinstance(raw, dict):
        return {
            _component(name): {} if sel in (None, "", {}) else selector(sel)
            for name, sel in raw.items()
        }
    if raw is None:
        return {}
    out: dict[str, dict[str, str]] = {}
    for item in _items(raw):
        name, sep, sel = _text(item).partition("=")
        if sep and not sel.strip():
            raise Invalid(f"{_show(item)} must be {COMPONENT_FORM}")
        out[_component(name)] = selector(sel) if sep else {}
    return out


def label_key(raw: Any) -> str:
    """A Kubernetes label key with a prefix (example.com/name) whose `<key>.state` is one too."""
    value = text(raw)
    prefix, sep, name = value.rpartition("/")
    if (
        not sep
        or not _LABEL_PREFIX.match(prefix + "/")
        or len(prefix) > 253
        or not _LABEL_NAME.match(name + ".state")
        or len(name + ".state") > 63
    ):
        raise Invalid(
            f"must be a label key such as nvidia.com/mig.config (a DNS prefix, '/', a name of"
            f" at most 57 characters), not {_show(raw)}"
        )
    return value


def driver_name(raw: Any) -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (gpu.example.com)."""
    value = text(raw)
    if len(value) > 63 or "." not in value or not _LABEL_PREFIX.match(value + "/"):
        raise Invalid(
            f"must be a DNS subdomain of at most 63 characters such as gpu.nodeagent.io,"
            f" not {_show(raw)}"
        )
    return value


def selectors(raw: Any) -> tuple[dict[str, str], ...]:
    return tuple(selector(item) for item in _items(raw))


def socket(raw: Any) -> Path | None:
    """A socket path; '' means do not ask the kubelet."""
    return None if raw is None or not _text(raw).strip() else Path(_text(raw).strip())


class Spec(NamedTuple):
    """One setting: `group.key` in the file, its variables, its flag, its parser."""

    group: str
    key: str
    field: str
    env: tuple[str, ...]
    flag: str | None
    parse: Parser
    help: str
    hot: bool = False
    short: str | None = None
    repeat: bool = False  # the flag may be given several times (items joined with ';')
    switch: bool = False  # the flag takes no value (sets true)

    @property
    def dotted(self) -> str:
        return f"{self.group}.{self.key}"

    @property
    def dest(self) -> str:
        return f"setting.{self.group}.{self.field}"


def _spec(
    group: str, key: str, env: str | tuple[str, ...], flag: str | None, parse: Parser, help: str,
    **kw: Any,
) -> Spec:  # fmt: skip
    field_name = kw.pop("field", key.replace("-", "_"))
    return Spec(group, key, field_name, (env,) if isinstance(env, str) else env, flag, parse,
                help, **kw)  # fmt: skip


SPECS: tuple[Spec, ...] = (
    _spec("node", "simulate", "NODEAGENT_SIMULATE", "--simulate", optional(text),
          "use the built-in GPU emulator, e.g. h200, h200x8, a100-40gbx2,h100-80gb"),
    _spec("node", "sim-state", "NODEAGENT_SIM_STATE", "--sim-state", optional(path),
          "keep the emulated GPUs' state in this JSON file"),
    _spec("node", "run-dir", "NODEAGENT_RUN_DIR", "--run-dir", path,
          "directory of the node-wide MIG writer lock", field="run_dir"),
    _spec("node", "log-level", "NODEAGENT_LOG_LEVEL", "--log-level",
          choice("debug", "info", "warning", "error"), "log level", hot=True),
    _spec("node", "log-format", "NODEAGENT_LOG_FORMAT", "--log-format",
          choice("auto", "json", "console"),
          "log format (auto: JSON unless stderr is a terminal)"),
    _spec("node", "nvml-wait", "NODEAGENT_NVML_WAIT", "--nvml-wait", seconds(0, inclusive=True),
          "nodeagent run: seconds to wait at start for NVML to answer (a driver still loading),"
          " retrying every 5 s; 0 fails at once", field="nvml_wait_seconds"),
    _spec("metrics", "address", "NODEAGENT_METRICS_ADDRESS", "--metrics-address", address,
          "HOST:PORT of /metrics, /healthz, /readyz"),
    _spec("metrics", "refresh-interval", "NODEAGENT_REFRESH_INTERVAL", "--refresh-interval",
          seconds(), "seconds between GPU reads", field="refresh_interval_seconds", hot=True),
    _spec("metrics", "gpm-interval", "NODEAGENT_GPM_INTERVAL", "--gpm-interval",
          seconds(0.1, inclusive=True), "seconds between GPM samples (two need 100 ms)",
          field="gpm_interval_seconds", hot=True),
    _spec("reconcile", "interval", "NODEAGENT_RECONCILE_INTERVAL", "--reconcile-interval",
          seconds(), "seconds between reconciles", field="interval_seconds", hot=True),
    _spec("mig", "config-file", "NODEAGENT_MIG_CONFIG_FILE", "--mig-config-file",
          optional(text), "mig-parted v1 file of MIG configs", short="-f", hot=True),
    _spec("mig", "config", "NODEAGENT_MIG_CONFIG", "--mig-config", optional(text),
          "name of the MIG config to keep applied", short="-c", hot=True),
    _spec("mig", "reset-command", "NODEAGENT_MIG_RESET_COMMAND", "--reset-command",
          optional(text), "command for a GPU whose MIG mode stays pending; {index} is the GPU",
          hot=True),
    _spec("mig", "lock-timeout", "NODEAGENT_MIG_LOCK_TIMEOUT", "--lock-timeout",
          seconds(0, inclusive=True), "seconds to wait for another MIG writer on this node",
          field="lock_timeout_seconds", hot=True),
    _spec("mig", "hooks-file", "NODEAGENT_MIG_HOOKS_FILE", "--hooks-file", optional(text),
          "mig-parted's hooks file: commands run before and after a MIG change", hot=True),
    _spec("mig", "hook-timeout", "NODEAGENT_MIG_HOOK_TIMEOUT", "--hook-timeout", seconds(),
          "seconds one hook command may run", field="hook_timeout_seconds", hot=True),
    _spec("sharing", "config-file", "NODEAGENT_SHARING_CONFIG_FILE", "--sharing-file",
          optional(text), "per-GPU sharing config file (nodeagent/v1, or mig-parted v1)",
          hot=True),
    _spec("sharing", "config", "NODEAGENT_SHARING_CONFIG", "--sharing-config", optional(text),
          "name of the sharing config to keep applied", hot=True),
    _spec("sharing", "plugin-config-out", "NODEAGENT_SHARING_PLUGIN_CONFIG_OUT",
          "--sharing-plugin-config-out", optional(path),
          "write NVIDIA's device plugin config (sharing.mps / timeSlicing) here", hot=True),
    _spec("sharing", "workload-file", "NODEAGENT_SHARING_WORKLOAD_FILE", "--workload-file",
          optional(text), "plan each GPU's sharing from this workload file and keep it applied",
          hot=True),
    _spec("labels", "prefix", "NODEAGENT_LABEL_PREFIX", "--label-prefix", label_prefix,
          "label prefix (another one beside GFD)", hot=True),
    _spec("labels", "nfd-features-file", "NODEAGENT_NFD_FEATURES_FILE", "--nfd-features-file",
          optional(path), "write labels for NFD's local source here", hot=True),
    _spec("labels", "mig-strategy", "NODEAGENT_MIG_STRATEGY", "--mig-strategy",
          choice("none", "single", "mixed"), "GFD's MIG label strategy", hot=True),
    _spec("labels", "machine-type-file", "NODEAGENT_MACHINE_TYPE_FILE", "--machine-type-file",
          path, "file holding the machine's product name (gpu.machine), as GFD reads it",
          hot=True),
    _spec("mps", "enabled", "NODEAGENT_MPS", "--mps", boolean,
          "run, supervise and publish the MPS control daemon", switch=True, hot=True),
    _spec("mps", "devices", "NODEAGENT_MPS_DEVICES", "--mps-devices", optional(devices),
          "GPU indices under MPS (default: every GPU without MIG)", hot=True),
    _spec("mps", "replicas", "NODEAGENT_MPS_REPLICAS", "--mps-replicas", integer(2),
          "clients sharing each GPU", hot=True),
    _spec("mps", "thread-percentage", "NODEAGENT_MPS_THREAD_PERCENTAGE",
          "--mps-thread-percentage", optional(integer(1, 100)),
          "default active thread percentage (default 100 // replicas)", hot=True),
    _spec("mps", "pinned-memory", "NODEAGENT_MPS_PINNED_MEMORY", "--mps-pinned-memory",
          optional(pinned_memory), "pinned memory limit: SIZE or INDEX=SIZE,...", hot=True),
    _spec("mps", "layout", "NODEAGENT_MPS_LAYOUT", "--mps-layout",
          choice("auto", "flat", "device-plugin"),
          "where the daemon lives: device-plugin (NVIDIA's plugin finds it), flat, or auto"),
    _spec("mps", "root", "NODEAGENT_MPS_ROOT", "--mps-root", path,
          "the MPS root (the device plugin's --mps-root)"),
    _spec("mps", "device-plugin-config", "NODEAGENT_MPS_DEVICE_PLUGIN_CONFIG",
          "--mps-device-plugin-config", optional(path),
          "the device plugin's config file: its sharing.mps resource name and replicas win",
          hot=True),
    _spec("mps", "shm-size", "NODEAGENT_MPS_SHM_SIZE", "--mps-shm-size", optional(size),
          "size of the <root>/shm tmpfs (default: half the host's memory, as upstream)"),
    _spec("mps", "pipe-dir", ("NODEAGENT_MPS_PIPE_DIR", "CUDA_MPS_PIPE_DIRECTORY"),
          "--mps-pipe-dir", optional(path), "CUDA_MPS_PIPE_DIRECTORY (default: from the layout)"),
    _spec("mps", "log-dir", ("NODEAGENT_MPS_LOG_DIR", "CUDA_MPS_LOG_DIRECTORY"), "--mps-log-dir",
          optional(path), "CUDA_MPS_LOG_DIRECTORY (default: from the layout)"),
    _spec("mps", "ready-file", "NODEAGENT_MPS_READY_FILE", "--mps-ready-file", optional(path),
          "written once the limits are read back (default: from the layout)"),
    _spec("mps", "control", "NODEAGENT_MPS_CONTROL", "--mps-control", text,
          "the control program"),
    _spec("mps", "exclusive-process", "NODEAGENT_MPS_EXCLUSIVE_PROCESS",
          "--mps-exclusive-process", optional(boolean),
          "EXCLUSIVE_PROCESS compute mode while MPS runs (default: on with the device-plugin"
          " layout, as upstream)", switch=True),
    _spec("mps", "probe-interval", "NODEAGENT_MPS_PROBE_INTERVAL", "--mps-probe-interval",
          seconds(), "seconds between health probes", field="probe_interval_seconds", hot=True),
    _spec("mps", "stop-on-exit", "NODEAGENT_MPS_STOP_ON_EXIT", "--mps-stop-on-exit", boolean,
          "quit the daemon when the agent exits (default: leave it to its clients)",
          switch=True, hot=True),
    _spec("kube", "enabled", "NODEAGENT_KUBE", "--kube", boolean,
          "publish labels to this Node and follow nvidia.com/mig.config", switch=True),
    _spec("kube", "node-name", ("NODEAGENT_NODE_NAME", "NODE_NAME"), "--node-name",
          optional(text), "this node's name (the downward API's NODE_NAME)"),
    _spec("kube", "kubeconfig", ("NODEAGENT_KUBECONFIG", "KUBECONFIG"), "--kubeconfig",
          optional(text), "outside a cluster: the kubeconfig file"),
    _spec("kube", "host", "NODEAGENT_KUBE_HOST", "--kube-host", optional(text),
          "API server URL without credentials (tests)"),
    _spec("kube", "pause-components", "NODEAGENT_PAUSE_COMPONENTS", "--pause-component",
          components, "NAME[=SELECTOR]: pause this GPU client around a MIG change (default:"
          " mig-manager's set; '' for none)", repeat=True, hot=True),
    _spec("kube", "restart-pods", "NODEAGENT_RESTART_PODS", "--restart-pods", selectors,
          "SELECTOR: delete these pods on this node after a change", repeat=True, hot=True),
    _spec("kube", "clients-wait", "NODEAGENT_CLIENTS_WAIT", "--clients-wait-seconds",
          seconds(), "seconds paused clients may take to leave", field="clients_wait_seconds",
          hot=True),
    _spec("kube", "pod-resources-socket", "NODEAGENT_POD_RESOURCES_SOCKET",
          "--pod-resources-socket", socket, "kubelet pod-resources socket ('' to not ask)"),
    _spec("kube", "watch-timeout", "NODEAGENT_WATCH_TIMEOUT", "--watch-timeout", seconds(),
          "seconds before the node watch is renewed", field="watch_timeout_seconds"),
    _spec("kube", "mig-config-label", "NODEAGENT_MIG_CONFIG_LABEL", "--mig-config-label",
          label_key, "the node label naming the wanted MIG config (its state: <label>.state)"),
    _spec("kube", "node-feature-api", "NODEAGENT_NODE_FEATURE_API", "--node-feature-api",
          boolean, "also publish the labels as an NFD NodeFeature object (needs NFD's CRD)",
          switch=True),
    _spec("kube", "pod-namespace", ("NODEAGENT_POD_NAMESPACE", "POD_NAMESPACE"),
          "--pod-namespace", optional(text), "the agent's namespace (the downward API)"),
    _spec("kube", "pod-name", ("NODEAGENT_POD_NAME", "POD_NAME"), "--pod-name",
          optional(text), "the agent's pod (the downward API): owner of its NodeFeature"),
    _spec("kube", "pod-uid", ("NODEAGENT_POD_UID", "POD_UID"), "--pod-uid", optional(text),
          "the agent's pod UID (the downward API)"),
    _spec("dra", "enabled", "NODEAGENT_DRA", "--dra", boolean,
          "with --kube: also run as a DRA driver (ResourceSlices, kubelet plugin)", switch=True),
    _spec("dra", "driver", "NODEAGENT_DRA_DRIVER", "--dra-driver", driver_name,
          "the DRA driver's name (DeviceClass selectors: device.driver)"),
    _spec("dra", "plugin-dir", "NODEAGENT_DRA_PLUGIN_DIR", "--dra-plugin-dir", optional(path),
          "dra.sock, checkpoint, MPS daemons (default /var/lib/kubelet/plugins/<driver>)"),
    _spec("dra", "registry-dir", "NODEAGENT_DRA_REGISTRY_DIR", "--dra-registry-dir", path,
          "the kubelet's plugin registry (<driver>-reg.sock goes here)"),
    _spec("dra", "cdi-dir", "NODEAGENT_DRA_CDI_DIR", "--dra-cdi-dir", path,
          "where the claims' CDI specs are written (the container runtime's CDI directory)"),
    _spec("dra", "devices", "NODEAGENT_DRA_DEVICES", "--dra-devices", optional(devices),
          "GPU indices DRA manages (default: every GPU); leave the others to the device plugin"),
)  # fmt: skip
BY_KEY = {s.dotted: s for s in SPECS}
SETTINGS_FILE_ENV = "NODEAGENT_CONFIG"
_STANDARD = "tag:yaml.org,2002:"


# -- the settings file ------------------------------------------------------------------


class FileValue(NamedTuple):
    raw: Any
    where: str  # file:line:col


def _read_file(file: str, errors: list[str]) -> dict[str, FileValue]:
    """Every `group.key` of the file with its raw value and position."""
    import yaml  # only when there is a file: the import costs 10 ms of every command

    try:
        data = Path(file).read_bytes()
    except OSError as err:
        errors.append(f"cannot read settings file {file}: {err.strerror}")
        return {}
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as err:
        errors.append(f"{file}: not UTF-8 text (byte {err.start})")
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(source, Loader=loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        errors.append(f"{where}: not valid YAML: {err.problem}")
        return {}
    except (yaml.YAMLError, RecursionError) as err:
        errors.append(f"{file}: not valid YAML: {type(err).__name__}")
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
        name = key.value if isinstance(key, yaml.ScalarNode) else None
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
            dotted = f"{name}.{sub.value}" if isinstance(sub, yaml.ScalarNode) else name
            if dotted not in BY_KEY:
                known = ", ".join(s.key for s in SPECS if s.group == name)
                errors.append(f"{at(sub)}: unknown key {dotted!r} (known in {name}: {known})")
                continue
            if dotted in out:
                errors.append(f"{at(sub)}: {dotted} given twice")
                continue
            try:
                raw = yaml.constructor.SafeConstructor().construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError, TypeError, RecursionError) as err:
                errors.append(f"{at(node)}: {dotted}: cannot read the value: {err}")
                continue
            out[dotted] = FileValue(raw, at(node))
    if version is None and root.value:
        errors.append(f"{file}: the first key must be version: {VERSION}")
    return out


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
    every value. `flags` maps Spec.dest to a flag's value (None: not given). Raises ConfigError
    with every problem of every source."""
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
    if "dra" in groups and s.dra.enabled and not s.kube.enabled:
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


def mps_layout(mps: Mps, kube_enabled: bool) -> str:
    if mps.layout != "auto":
        return mps.layout
    return "device-plugin" if kube_enabled else "flat"


def mps_daemon_settings(
    mps: Mps, devices: tuple[int, ...], kube_enabled: bool = False
) -> MpsSettings:
    """What the MPS daemon is started with, once its GPUs are known: the layout's paths, and
    the resource name and replicas of the device plugin's config when one is given. Raises
    ConfigError for a bad plugin config."""
    from nodeagent.mps.layout import DEFAULT_RESOURCE, paths, read_plugin_config
    from nodeagent.mps.settings import MpsSettings, parse_pinned

    layout = mps_layout(mps, kube_enabled)
    resource, replicas = DEFAULT_RESOURCE, mps.replicas
    if mps.device_plugin_config is not None:
        plugin = read_plugin_config(mps.device_plugin_config)
        resource, replicas = plugin.resource, plugin.replicas
    where = paths(layout, mps.root, resource)
    exclusive = mps.exclusive_process
    return MpsSettings(
        devices=devices,
        replicas=replicas,
        thread_percentage=mps.thread_percentage,
        pinned_memory=parse_pinned(mps.pinned_memory, devices),
        pipe_dir=mps.pipe_dir or where.pipe_dir,
        log_dir=mps.log_dir or where.log_dir,
        ready_file=mps.ready_file or where.ready_file,
        control_binary=mps.control,
        exclusive_process=layout == "device-plugin" if exclusive is None else exclusive,
        probe_interval_seconds=mps.probe_interval_seconds,
        layout=layout,
        started_file=where.started_file,
        shm_dir=where.shm_dir,
        shm_size=mps.shm_size,
    )


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
