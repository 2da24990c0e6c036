"""Where the MPS daemon lives on disk, and what NVIDIA's device plugin expects there.

Two layouts:

- `flat` (bare metal): `<root>/pipe`, `<root>/log`, a JSON ready file `<root>/ready`.
- `device-plugin` (Kubernetes): what k8s-device-plugin's own mps-control-daemon makes, so the
  unmodified plugin serves pods from nodeagent's daemon (k8s-device-plugin commit 1b826ac,
  cmd/mps-control-daemon/mps/{root,daemon}.go, internal/plugin/mps.go):
  `<root>/<resource>/pipe` and `/log` (the resource name keeps its '/':
  `/run/nvidia/mps/nvidia.com/gpu/pipe`), an empty `<root>/<resource>/.started` once the
  daemon and its limits are up, an empty `<root>/.ready` once every daemon is, and `<root>/shm`,
  a tmpfs the plugin mounts as `/dev/shm` of every MPS client (and that must be the daemon's
  `/dev/shm` too). The plugin probes the daemon with `get_default_active_thread_percentage`
  through `/mps/<resource>/pipe` and hands pods `CUDA_MPS_PIPE_DIRECTORY` and both mounts.

The plugin's own config (`sharing.mps.resources[]`, the file its ConfigMap mounts) is the one
source of the resource name and replicas: nodeagent reads the same file.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nodeagent.base.configfile import compose_document, construct, read_text
from nodeagent.base.errors import ConfigError, MpsError
from nodeagent.base.files import chmod_folder, read_regular
from nodeagent.mps.settings import MAX_PLUGIN_REPLICAS

RESOURCE_NAME = re.compile(  # a DNS subdomain, '/', a label name (no '..', no absolute path)
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
FLAT = "flat"
DEVICE_PLUGIN = "device-plugin"
DEFAULT_RESOURCE = "nvidia.com/gpu"
PROC_BYTES = 1 << 20  # /proc/meminfo, /proc/self/mounts: a few KiB
SHM_FALLBACK_KIB = 65536  # upstream's size when /proc/meminfo cannot be read
# Upstream's mps-control-daemon labels the pipe directory for unprivileged containers where
# SELinux is enabled, as go-selinux's Chcon(path, label, recursive) (cmd/mps-control-daemon/mps/
# daemon.go: unprivilegedContainerSELinuxLabel, setSELinuxContext); enabled means the selinuxfs
# is there.
CONTAINER_FILE_LABEL = "system_u:object_r:container_file_t:s0"
SELINUX_FS = Path("/sys/fs/selinux")


@dataclass(frozen=True)
class Paths:
    """Every path of one daemon in one layout."""

    layout: str
    root: Path
    resource: str
    pipe_dir: Path
    log_dir: Path
    ready_file: Path  # flat: JSON status; device-plugin: <root>/.ready (empty)
    started_file: Path | None  # device-plugin: <root>/<resource>/.started
    shm_dir: Path | None  # device-plugin: <root>/shm


def paths(layout: str, root: Path, resource: str = DEFAULT_RESOURCE) -> Paths:
    if layout == DEVICE_PLUGIN:
        base = root / resource
        return Paths(
            layout, root, resource, base / "pipe", base / "log", root / ".ready",
            base / ".started", root / "shm",
        )  # fmt: skip
    return Paths(layout, root, resource, root / "pipe", root / "log", root / "ready", None, None)


@dataclass(frozen=True)
class PluginMps:
    """The MPS part of the device plugin's config: the one shared resource and its replicas."""

    resource: str
    replicas: int
    source: str


def read_plugin_config(path: Path) -> PluginMps:
    """`sharing.mps.resources` of the device plugin's config file (version v1). Raises
    ConfigError naming the file when it is missing, invalid, or has no usable MPS resource."""
    where = f"device plugin config {path}"
    text = read_text(str(path), "device plugin config")
    root = compose_document(text, where)  # bounded: no billion laughs, no alias cycle
    document = None if root is None else construct(root, where)
    if not isinstance(document, dict) or document.get("version") != "v1":
        raise ConfigError(f"{where} must be a mapping with version: v1")
    mps = (
        (document.get("sharing") or {}).get("mps")
        if isinstance(document.get("sharing"), dict)
        else None
    )
    resources = mps.get("resources") if isinstance(mps, dict) else None
    if not isinstance(resources, list) or not resources:
        raise ConfigError(f"{where} has no sharing.mps.resources: MPS is not configured there")
    if len(resources) > 1:
        raise ConfigError(
            f"{where} lists {len(resources)} MPS resources; the plugin gives every MPS resource"
            " all GPUs, so nodeagent serves one (list one)"
        )
    entry = resources[0]
    name = entry.get("name") if isinstance(entry, dict) else None
    replicas = entry.get("replicas") if isinstance(entry, dict) else None
    if isinstance(name, str) and "/" not in name:
        name = DEFAULT_RESOURCE.split("/")[0] + "/" + name  # as upstream: gpu -> nvidia.com/gpu
    if not isinstance(name, str) or not RESOURCE_NAME.match(name):
        raise ConfigError(
            f"{where}: sharing.mps.resources[0].name must be a resource name like"
            f" nvidia.com/gpu, not {name!r}"
        )
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        raise ConfigError(f"{where}: sharing.mps.resources[0].replicas must be 2 or more")
    if replicas > MAX_PLUGIN_REPLICAS:  # bounded here: it becomes a label value, a device list
        raise ConfigError(
            f"{where}: sharing.mps.resources[0].replicas must be at most {MAX_PLUGIN_REPLICAS}"
            " (the device plugin refuses more MPS clients per GPU)"
        )
    if mps.get("renameByDefault") is True:  # type: ignore[union-attr]
        name += ".shared"  # as the plugin renames it (api/config/v1/replicas.go)
    return PluginMps(name, replicas, str(path))


def prepare(p: Paths, selinux_fs: Path | None = None) -> str:
    """Make the daemon's folders, traversable by non-root client containers (0755; a 0700
    root keeps them out: bottlerocket #4673), and in the device plugin's layout give the pipe
    directory the SELinux context containers may use (`label_for_containers`; `selinux_fs`:
    where SELinux shows it is enabled). Returns what was done about SELinux. Raises MpsError,
    or ConfigError when one of them is a symbolic link (its mode is never set through one)."""
    folders = [p.root, p.pipe_dir, p.log_dir]
    if p.started_file is not None:
        folders.insert(1, p.started_file.parent)
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if folder == p.root or p.root in folder.parents:
                chmod_folder(folder, 0o755, "the MPS directory")
        except OSError as err:
            raise MpsError(f"cannot make MPS directory {folder}: {err.strerror}") from err
    if p.layout != DEVICE_PLUGIN:
        return "flat layout: SELinux context left as it is"
    return label_for_containers(p.pipe_dir, SELINUX_FS if selinux_fs is None else selinux_fs)


def label_for_containers(folder: Path, selinux_fs: Path) -> str:
    """`chcon -R system_u:object_r:container_file_t:s0 FOLDER` where SELinux is enabled (the
    selinuxfs at `selinux_fs` exists), as upstream's daemon labels its pipe directory so that
    confined client containers can reach the daemon; nothing where SELinux is not. Returns what
    was done. Raises MpsError when SELinux is on and the context cannot be set."""
    try:
        selinux_fs.stat()
    except FileNotFoundError:
        return f"SELinux disabled (no {selinux_fs}): context not set"
    except OSError as err:
        raise MpsError(f"cannot tell whether SELinux is enabled ({selinux_fs}): {err}") from err
    _tool(
        ["chcon", "-R", CONTAINER_FILE_LABEL, str(folder)],
        f"SELinux is enabled but the MPS pipe directory {folder} cannot be labelled"
        f" {CONTAINER_FILE_LABEL} for containers",
    )
    return f"{folder} labelled {CONTAINER_FILE_LABEL}"


def _tool(command: list[str], failed: str) -> None:
    """Run a host tool (30 s at most). Raises MpsError: `failed`, then the tool's last line of
    output (or its exit status, or why it could not run)."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MpsError(f"{failed} ({command[0]}: {err})") from err
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        end = f": {detail[-1]}" if detail else f" ({command[0]} exit {proc.returncode})"
        raise MpsError(failed + end)


def shm_size_kib(text: str | None) -> int:
    """The tmpfs size: an explicit size, else half the host's memory as upstream mounts it."""
    if text:
        from nodeagent.mps.settings import parse_size

        return max(parse_size(text, "MPS shm size") // 1024, 1)
    try:
        meminfo = read_regular("/proc/meminfo", "/proc/meminfo", PROC_BYTES) or b""
        for line in meminfo.decode(errors="replace").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 2
    except (ConfigError, ValueError, IndexError):
        pass
    return SHM_FALLBACK_KIB


def _unescape(field: str) -> str:
    """/proc/self/mounts writes a space as \\040 (octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_mounted(path: Path) -> bool:
    """Whether a tmpfs is mounted at `path` (symlinks and relative paths resolved)."""
    real = os.path.realpath(path)
    try:
        data = read_regular("/proc/self/mounts", "the mount table", PROC_BYTES) or b""
    except ConfigError:
        return False
    lines = data.decode(errors="replace").splitlines()
    fields = (line.split() for line in lines)
    return any(len(f) > 2 and _unescape(f[1]) == real and f[2] == "tmpfs" for f in fields)


def mount_shm(shm_dir: Path, size_kib: int) -> str:
    """Mount `<root>/shm` as a tmpfs (as upstream's `mount-shm`: rw,nosuid,nodev,noexec) unless
    one is there; 1777 like /dev/shm. Returns what was done. Raises MpsError naming what is
    missing (mounting needs CAP_SYS_ADMIN and, in a container, Bidirectional propagation)."""
    if shm_dir.is_symlink():  # a tmpfs over the link's target would hide what is there
        raise MpsError(f"{shm_dir} is a symbolic link; the MPS shm must be a folder of its own")
    try:
        shm_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MpsError(f"cannot make {shm_dir}: {err.strerror}") from err
    if is_mounted(shm_dir):
        return f"{shm_dir} is a tmpfs already"
    options = f"rw,nosuid,nodev,noexec,relatime,size={size_kib}k,mode=1777"
    _tool(
        ["mount", "-t", "tmpfs", "-o", options, "shm", str(shm_dir)],
        f"cannot mount a tmpfs at {shm_dir} (needs CAP_SYS_ADMIN; in a container a"
        " Bidirectional mount of the MPS root)",
    )
    return f"mounted a {size_kib // 1024} MiB tmpfs at {shm_dir}"


def same_filesystem(a: Path, b: Path) -> bool:
    """Whether two paths are on one mounted file system (one tmpfs)."""
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False
