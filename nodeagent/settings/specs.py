"""One row per setting: its file key, environment variable(s), flag, parser, help, and whether
a reload may change it."""

from __future__ import annotations

from typing import Any, NamedTuple

from nodeagent.settings.parsers import (
    Parser,
    address,
    boolean,
    choice,
    command,
    commands,
    components,
    devices,
    driver_name,
    fallbacks,
    faults,
    integer,
    label_key,
    label_prefix,
    optional,
    path,
    pinned_memory,
    seconds,
    selectors,
    size,
    socket,
    text,
    xids,
)


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
    _spec("metrics", "web-config-file", "NODEAGENT_WEB_CONFIG_FILE", "--web.config.file",
          optional(path), "TLS and basic auth of the metrics endpoint: Prometheus"
          " exporter-toolkit's web config file"),
    _spec("metrics", "health-details", "NODEAGENT_HEALTH_DETAILS", "--health-details", boolean,
          "show paths and pids in /healthz and /readyz (debugging)", switch=True),
    _spec("metrics", "dcgm-compat", "NODEAGENT_DCGM_COMPAT", "--dcgm-compat", boolean,
          "also serve dcgm-exporter's DCGM_FI_* families and labels on /metrics",
          switch=True, hot=True),
    _spec("reconcile", "interval", "NODEAGENT_RECONCILE_INTERVAL", "--reconcile-interval",
          seconds(), "seconds between reconciles", field="interval_seconds", hot=True),
    _spec("mig", "config-file", "NODEAGENT_MIG_CONFIG_FILE", "--mig-config-file",
          optional(text), "mig-parted v1 file of MIG configs", short="-f", hot=True),
    _spec("mig", "config", "NODEAGENT_MIG_CONFIG", "--mig-config", optional(text),
          "name of the MIG config to keep applied", short="-c", hot=True),
    _spec("mig", "reset-command", "NODEAGENT_MIG_RESET_COMMAND", "--reset-command",
          optional(command), "command for a GPU whose MIG mode stays pending; {index} is the GPU",
          hot=True),
    _spec("mig", "lock-timeout", "NODEAGENT_MIG_LOCK_TIMEOUT", "--lock-timeout",
          seconds(0, inclusive=True),
          "seconds to wait for another MIG writer on this node, its wait for the ownership"
          " record's lock included",
          field="lock_timeout_seconds", hot=True),
    _spec("mig", "hooks-file", "NODEAGENT_MIG_HOOKS_FILE", "--hooks-file", optional(text),
          "mig-parted's hooks file: commands run before and after a MIG change", hot=True),
    _spec("mig", "hook-timeout", "NODEAGENT_MIG_HOOK_TIMEOUT", "--hook-timeout", seconds(),
          "seconds one hook command may run", field="hook_timeout_seconds", hot=True),
    _spec("mig", "with-reboot", ("NODEAGENT_MIG_WITH_REBOOT", "WITH_REBOOT"), "--with-reboot",
          boolean, "reboot the node when a MIG mode change waits for a reboot (mig-manager's"
          " WITH_REBOOT; its state label says 'rebooting' first)", switch=True, hot=True),
    _spec("mig", "reboot-command", "NODEAGENT_MIG_REBOOT_COMMAND", "--reboot-command", command,
          "the command that reboots the node (with mig.with-reboot)", hot=True),
    _spec("mig", "cdi-refresh", ("NODEAGENT_MIG_CDI_REFRESH", "CDI_ENABLED"), "--cdi-refresh",
          boolean, "after a MIG change, run mig.cdi-commands before reporting success"
          " (mig-manager's CDI_ENABLED)", switch=True, hot=True),
    _spec("mig", "cdi-commands", "NODEAGENT_MIG_CDI_COMMANDS", "--cdi-command", commands,
          "commands that refresh the CDI specs, in order (';' between them in a variable)",
          repeat=True, hot=True),
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
    _spec("labels", "device-plugin-config-file", "NODEAGENT_DEVICE_PLUGIN_CONFIG_FILE",
          "--device-plugin-config-file", optional(path),
          "NVIDIA's device plugin config the labels follow (GFD's CONFIG_FILE)", hot=True),
    _spec("labels", "device-plugin-config-dir", "NODEAGENT_DEVICE_PLUGIN_CONFIG_DIR",
          "--device-plugin-config-dir", optional(path),
          "folder of named device plugin configs, one chosen per node (config-manager's"
          " CONFIG_FILE_SRCDIR)", hot=True),
    _spec("labels", "device-plugin-default-config", "NODEAGENT_DEVICE_PLUGIN_DEFAULT_CONFIG",
          "--device-plugin-default-config", optional(text),
          "the named config without a node label (config-manager's DEFAULT_CONFIG)", hot=True),
    _spec("labels", "device-plugin-fallback-strategies",
          "NODEAGENT_DEVICE_PLUGIN_FALLBACK_STRATEGIES", "--device-plugin-fallback-strategies",
          fallbacks, "named, single, empty: where no label nor default names a config"
          " (config-manager's FALLBACK_STRATEGIES)", hot=True),
    _spec("labels", "device-plugin-config-label", "NODEAGENT_DEVICE_PLUGIN_CONFIG_LABEL",
          "--device-plugin-config-label", label_key,
          "node label naming the device plugin config (config-manager's NODE_LABEL)", hot=True),
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
    _spec("dra", "health-interval", "NODEAGENT_DRA_HEALTH_INTERVAL", "--dra-health-interval",
          seconds(), "seconds between fault polls (XIDs, uncorrected ECC, row remapping): a"
          " faulty device's taint is written within this and one ResourceSlice write",
          field="health_interval_seconds", hot=True),
    _spec("dra", "health-hold", "NODEAGENT_DRA_HEALTH_HOLD", "--dra-health-hold", seconds(),
          "seconds a device stays tainted after its last XID or uncorrected ECC error (healthy"
          " again after this long without a new one; row-remap faults last while NVML says so)",
          field="health_hold_seconds", hot=True),
    _spec("dra", "fatal-faults", "NODEAGENT_DRA_FATAL_FAULTS", "--dra-fatal-faults", faults,
          "faults whose taint is NoExecute (pods using the device are evicted) instead of"
          " NoSchedule: xid (every XID), xid-<code>, ecc-uncorrected, row-remap-pending,"
          " row-remap-failure, recovery (every recovery action the driver reports),"
          " recovery-<action> (gpu-reset, node-reboot, drain-p2p, drain-and-reset,"
          " recover-imex-domain, bus-reset, system-reboot)", hot=True),
    _spec("dra", "ignored-xids", "NODEAGENT_DRA_IGNORED_XIDS", "--dra-ignored-xids", xids,
          "XIDs that taint nothing: an application's own errors (NVIDIA's device plugin ignores"
          " the same: 13, 31, 43, 45, 68, 109)", hot=True),
    _spec("dra", "mps-shares", "NODEAGENT_DRA_MPS_SHARES", "--dra-mps-shares",
          choice("none", "gpus", "mig"), "MPS shares as consumable capacity: none; gpus (each"
          " GPU with MIG off also a device several claims share, each sized in SM percent and"
          " memory); mig (also each MIG placement)"),
    _spec("dra", "binding-conditions", "NODEAGENT_DRA_BINDING_CONDITIONS",
          "--dra-binding-conditions", boolean,
          "MIG slices not made yet carry binding conditions: made before the pod binds, a"
          " failure reschedules the pod (needs DRADeviceBindingConditions; dropped: off)",
          hot=True),
    _spec("dra", "mps-share-enforce", "NODEAGENT_DRA_MPS_SHARE_ENFORCE",
          "--dra-mps-share-enforce", choice("report", "end-client"),
          "an MPS share claim's client over its share (it asks for more SMs or memory than its"
          " claim has, or uses more memory): report (a ShareLimits condition on the claim, an"
          " Event, a metric) or end-client (also SIGKILL that client)"),
    _spec("dra", "mps-share-sm-limit", "NODEAGENT_DRA_MPS_SHARE_SM_LIMIT",
          "--dra-mps-share-sm-limit", integer(1, 100),
          "an MPS share claim's SM limit in percent (its clients' ceiling) where neither its"
          " MpsShare config nor its DeviceClass's sets smLimit; never below the claim's request"
          " (100: a share bursts into the idle GPU)"),
)  # fmt: skip
BY_KEY = {s.dotted: s for s in SPECS}
SETTINGS_FILE_ENV = "NODEAGENT_CONFIG"
_STANDARD = "tag:yaml.org,2002:"
