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
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nodeagent.errors import ConfigError, MpsError

FLAT = "flat"
DEVICE_PLUGIN = "device-plugin"
DEFAULT_RESOURCE = "nvidia.com/gpu"
SHM_FALLBACK_KIB = 65536  # upstream's size when /proc/meminfo cannot be read


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
    import yaml

    try:
        document = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read the device plugin's config {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"device plugin config {path} is not UTF-8 text") from err
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"device plugin config {path} is not valid YAML") from err
    where = f"device plugin config {path}"
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
    if not isinstance(name, str) or "/" not in name:
        raise ConfigError(f"{where}: sharing.mps.resources[0].name must be like nvidia.com/gpu")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        raise ConfigError(f"{where}: sharing.mps.resources[0].replicas must be 2 or more")
    if mps.get("renameByDefault") is True:  # type: ignore[union-attr]
        name += ".shared"  # as the plugin renames it (api/config/v1/replicas.go)
    return PluginMps(name, replicas, str(path))


def prepare(p: Paths) -> None:
    """Make the daemon's folders, traversable by non-root client containers (0755; a 0700
    root keeps them out: bottlerocket #4673). Raises MpsError."""
    folders = [p.root, p.pipe_dir, p.log_dir]
    if p.started_file is not None:
        folders.insert(1, p.started_file.parent)
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if folder == p.root or p.root in folder.parents:
                os.chmod(folder, 0o755)
        except OSError as err:
            raise MpsError(f"cannot make MPS directory {folder}: {err.strerror}") from err


def shm_size_kib(text: str | None) -> int:
    """The tmpfs size: an explicit size, else half the host's memory as upstream mounts it."""
    if text:
        from nodeagent.mps.settings import parse_size

        return max(parse_size(text, "MPS shm size") // 1024, 1)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 2
    except (OSError, ValueError, IndexError):
        pass
    return SHM_FALLBACK_KIB


def is_mounted(path: Path) -> bool:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(len(f) > 2 and f[1] == str(path) and f[2] == "tmpfs" for f in map(str.split, lines))


def mount_shm(shm_dir: Path, size_kib: int) -> str:
    """Mount `<root>/shm` as a tmpfs (as upstream's `mount-shm`: rw,nosuid,nodev,noexec) unless
    one is there; 1777 like /dev/shm. Returns what was done. Raises MpsError naming what is
    missing (mounting needs CAP_SYS_ADMIN and, in a container, Bidirectional propagation)."""
    try:
        shm_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MpsError(f"cannot make {shm_dir}: {err.strerror}") from err
    if is_mounted(shm_dir):
        return f"{shm_dir} is a tmpfs already"
    options = f"rw,nosuid,nodev,noexec,relatime,size={size_kib}k,mode=1777"
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "shm", str(shm_dir)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MpsError(f"cannot mount a tmpfs at {shm_dir}: {err}") from err
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise MpsError(
            f"cannot mount a tmpfs at {shm_dir} (needs CAP_SYS_ADMIN; in a container a"
            " Bidirectional mount of the MPS root)" + (f": {detail[-1]}" if detail else "")
        )
    return f"mounted a {size_kib // 1024} MiB tmpfs at {shm_dir}"
