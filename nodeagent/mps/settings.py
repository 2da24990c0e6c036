"""MPS settings and their validation. Pure: everything is checked before anything starts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.base.errors import ConfigError
from nodeagent.base.units import is_digits
from nodeagent.base.units import parse_size as parse_size
from nodeagent.nvml.inventory import Inventory

DEFAULT_ROOT = Path("/run/nvidia/mps")
MAX_PIPE_DIR_BYTES = 96  # + "/" + socket names within a 108-byte sun_path
MAX_PLUGIN_REPLICAS = 48  # k8s-device-plugin internal/rm/device.go (16 before Turing)


def mps_size(n: int) -> str:
    """Bytes -> the daemon's notation, in whole MiB ('2048M')."""
    return f"{n // (1 << 20)}M"


@dataclass(frozen=True)
class MpsSettings:
    """What `nodeagent mps start` and the agent use. `devices` are NVML GPU indices."""

    devices: tuple[int, ...] = (0,)
    replicas: int = 2
    thread_percentage: int | None = None  # default: 100 // replicas
    pinned_memory: dict[int, str] = field(
        default_factory=dict
    )  # GPU index -> size; default: memory / replicas
    pipe_dir: Path = DEFAULT_ROOT / "pipe"
    log_dir: Path = DEFAULT_ROOT / "log"
    ready_file: Path = DEFAULT_ROOT / "ready"
    control_binary: str = "nvidia-cuda-mps-control"
    exclusive_process: bool = False
    command_timeout_seconds: float = 5.0
    probe_interval_seconds: float = 5.0
    layout: str = "flat"  # or "device-plugin" (see nodeagent.mps.layout)
    started_file: Path | None = None  # device-plugin: <root>/<resource>/.started
    shm_dir: Path | None = None  # device-plugin: <root>/shm, a tmpfs
    shm_size: str | None = None  # None: half the host's memory

    @property
    def percentage(self) -> int:
        return (
            self.thread_percentage if self.thread_percentage is not None else 100 // self.replicas
        )


@dataclass(frozen=True)
class Limits:
    """The values to set and read back: thread percentage, and bytes per MPS device index
    (the CUDA ordinal under CUDA_VISIBLE_DEVICES, i.e. the position in `devices`)."""

    thread_percentage: int
    pinned_bytes: dict[int, int]
    visible_devices: str  # CUDA_VISIBLE_DEVICES for the daemon: the GPUs' UUIDs


def validate(settings: MpsSettings, inventory: Inventory) -> Limits:
    """Check every value against the node; raise ConfigError listing all problems."""
    problems: list[str] = []
    if settings.replicas < 2:
        problems.append(f"replicas must be 2 or more, not {settings.replicas}")
    if settings.thread_percentage is not None and not 1 <= settings.thread_percentage <= 100:
        problems.append(f"thread percentage must be 1-100, not {settings.thread_percentage}")
    if settings.layout == "device-plugin" and settings.replicas > MAX_PLUGIN_REPLICAS:
        problems.append(
            f"{settings.replicas} replicas: NVIDIA's device plugin refuses more than"
            f" {MAX_PLUGIN_REPLICAS} MPS clients per GPU (compute capability 7.5 and later)"
        )
    if settings.thread_percentage is None and settings.replicas > 100:
        problems.append(
            f"{settings.replicas} replicas leave each client 0 % of the SMs (100 // replicas);"
            " use at most 100 replicas or set the thread percentage"
        )
    if not settings.devices:
        problems.append("no GPU selected for MPS")
    if len(os.fsencode(settings.pipe_dir)) > MAX_PIPE_DIR_BYTES:
        problems.append(
            f"the MPS pipe directory {settings.pipe_dir} is too long for the daemon's unix"
            f" sockets in it (at most {MAX_PIPE_DIR_BYTES} bytes; a socket path is at most 107)"
        )
    if len(set(settings.devices)) != len(settings.devices):
        problems.append(f"GPU indices listed twice: {list(settings.devices)}")
    gpus = {g.index: g for g in inventory.gpus}
    for index in settings.devices:
        gpu = gpus.get(index)
        if gpu is None:
            problems.append(f"GPU {index} does not exist; this node has GPUs {sorted(gpus)}")
        elif gpu.mig_current or gpu.mig_pending:
            problems.append(
                f"GPU {index} has MIG enabled: MPS inside MIG slices is not supported;"
                " disable MIG on it (a config with mig-enabled: false) or pick another GPU"
            )
    for index in settings.pinned_memory:
        if index not in settings.devices:
            problems.append(f"pinned memory limit given for GPU {index}, which is not under MPS")
    pinned: dict[int, int] = {}
    for position, index in enumerate(settings.devices):
        gpu = gpus.get(index)
        if gpu is None:
            continue
        text = settings.pinned_memory.get(index)
        try:
            size = (
                parse_size(text, f"pinned memory limit of GPU {index}")
                if text
                else gpu.memory_total_bytes // max(settings.replicas, 1)
            )
        except ConfigError as err:
            problems.append(str(err))
            continue
        if size < 1 << 20:
            given = text or f"(its memory / {settings.replicas} replicas: {size} bytes)"
            problems.append(
                f"pinned memory limit {given} of GPU {index} is under 1 MiB; the daemon takes"
                " whole MiB (a limit of 0 would be no limit)"
            )
        if size > gpu.memory_total_bytes:
            problems.append(
                f"pinned memory limit {text} of GPU {index} is more than its"
                f" {gpu.memory_total_bytes >> 20} MiB"
            )
        if not text and size >= 1 << 30 and settings.layout != "device-plugin":
            # The real daemon prints limits in whole G (35942M reads back as 35G, seen on an
            # H200): a default in whole GiB reads back exactly.
            size = size >> 30 << 30
        pinned[position] = size >> 20 << 20  # the daemon takes whole MiB
    if settings.command_timeout_seconds <= 0 or settings.probe_interval_seconds <= 0:
        problems.append("timeouts and intervals must be > 0")
    if problems:
        raise ConfigError("MPS settings: " + "; ".join(problems))
    visible = ",".join(gpus[i].uuid for i in settings.devices)
    return Limits(settings.percentage, pinned, visible)


def parse_pinned(text: str | None, devices: tuple[int, ...]) -> dict[int, str]:
    """'2G' (every GPU) or '0=2G,1=4G' -> {gpu index: size}; sizes are checked by validate()."""
    if not text:
        return {}
    if "=" not in text:
        return dict.fromkeys(devices, text)
    out: dict[int, str] = {}
    for part in text.split(","):
        index, sep, size = part.partition("=")
        if not sep or not is_digits(index.strip()):
            raise ConfigError(f"pinned memory limit {part!r} must be SIZE or INDEX=SIZE,...")
        if int(index) in out:
            raise ConfigError(f"pinned memory limit {text!r} gives GPU {int(index)} twice")
        out[int(index)] = size.strip()
    return out
