"""The settings groups: frozen dataclasses with every default, and the names of the groups."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "nodeagent/v1"
DEFAULT_METRICS_ADDRESS = "0.0.0.0:9401"  # dcgm-exporter keeps 9400: both can run on a node
DEFAULT_LABEL_PREFIX = "nvidia.com/"
DEFAULT_MPS_ROOT = Path("/run/nvidia/mps")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_RUN_DIR = Path("/run/nodeagent")
# XIDs an application causes, no fault of the GPU's (NVIDIA/k8s-device-plugin
# internal/rm/health.go, applicationErrorXids: 13 graphics engine exception, 31 GPU memory page
# fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception, 109
# context switch timeout).
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
DEFAULT_REBOOT_COMMAND = "systemctl reboot"
# mig-manager's CDI refresh after a MIG change (NVIDIA/mig-parted bd7160f4,
# pkg/mig/reconfigure/reconfigure.go handleCDI/createCDISpec), for a driver installed on the
# host: the control device nodes (nvidia-caps), then the management CDI spec.
DEFAULT_CDI_COMMANDS = (
    "nvidia-ctk system create-device-nodes --control-devices",
    "nvidia-ctk cdi generate --mode=management --vendor=management.nvidia.com --class=gpu"
    " --output=/var/run/cdi/management.nvidia.com-gpu.yaml",
)
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
    # GPM ratios are averages over this window; dcgm-exporter collects every 30 s by default.
    gpm_interval_seconds: float = 5.0
    web_config_file: Path | None = None  # TLS and basic auth (exporter-toolkit's format)
    health_details: bool = False  # /healthz and /readyz with paths and pids
    dcgm_compat: bool = False  # also serve dcgm-exporter's DCGM_FI_* families on /metrics


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
    # mig-manager's host duties (nodeagent.host.duties): reboot when a MIG mode change waits
    # for one (WITH_REBOOT), and refresh the CDI specs after a MIG change (CDI_ENABLED).
    with_reboot: bool = False
    reboot_command: str = DEFAULT_REBOOT_COMMAND
    cdi_refresh: bool = False
    cdi_commands: tuple[str, ...] = DEFAULT_CDI_COMMANDS


@dataclass(frozen=True)
class Sharing:
    """The per-GPU sharing config (nodeagent/v1): MIG here, MPS there, time-slicing elsewhere."""

    config_file: str | None = None
    config: str | None = None
    plugin_config_out: Path | None = None  # write NVIDIA's device plugin config here
    workload_file: str | None = None  # plan the sharing from this workload file (nodeagent.planner)


@dataclass(frozen=True)
class Labels:
    prefix: str = DEFAULT_LABEL_PREFIX
    nfd_features_file: Path | None = None
    mig_strategy: str = "mixed"  # GFD's --mig-strategy: none, single or mixed
    machine_type_file: Path = Path("/sys/class/dmi/id/product_name")  # gpu.machine (GFD's)
    # NVIDIA's device plugin config the labels follow (nodeagent.labels.devicepluginconfig): one
    # file (GFD's CONFIG_FILE), or a folder of named configs as config-manager reads it.
    device_plugin_config_file: Path | None = None
    device_plugin_config_dir: Path | None = None
    device_plugin_default_config: str | None = None
    device_plugin_fallback_strategies: tuple[str, ...] = ("named", "single")  # the Helm chart's
    device_plugin_config_label: str = "nvidia.com/device-plugin.config"


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
    health_interval_seconds: float = 0.5
    health_hold_seconds: float = 60.0
    fatal_faults: tuple[str, ...] = ()
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS
    mps_shares: str = "none"  # none | gpus | mig: which devices have an MPS share device
    # MIG placements not made yet carry binding conditions (KEP-5007): the slice is made before
    # the pod binds, and a failure reschedules the pod
    binding_conditions: bool = True
    # a share claim's client over its share: report (condition, Event, metric) or end-client too
    mps_share_enforce: str = "report"
    # a share claim's SM limit (its clients' ceiling) where neither it nor its class sets one
    mps_share_sm_limit: int = 100

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
