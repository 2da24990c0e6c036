"""GFD-compatible node labels ("mixed" MIG strategy) from an Inventory. Pure.

Names and values follow GPU Feature Discovery so existing nodeSelectors keep working; the
prefix (default `nvidia.com/`) is configurable for clusters that also run GFD.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.nvml.inventory import Gpu, Inventory

DEFAULT_PREFIX = "nvidia.com/"
_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class SharingState:
    """How the node's full GPUs are shared: 'none' or 'mps' with `replicas` clients each."""

    strategy: str = "none"
    replicas: int = 1


def _value(text: str) -> str:
    """A valid label value: GFD turns spaces into '-'; other bad characters become '_';
    at most 63 characters, starting and ending alphanumeric."""
    text = _VALUE_BAD.sub("_", text.replace(" ", "-"))[:63]
    return text.strip("-_.")


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def profile_label(profile: str) -> str:
    """GFD writes '+' in a profile name as '.': mig-1g.18gb+me -> mig-1g.18gb.me."""
    return "mig-" + profile.replace("+", ".")


GPU_SHARING_PREFIX = "nodeagent.io/gpu."


def render_labels(
    inventory: Inventory,
    sharing: SharingState = SharingState(),
    prefix: str = DEFAULT_PREFIX,
    per_gpu: Mapping[int, tuple[str, int]] | None = None,
) -> dict[str, str]:
    """Every label nodeagent owns for this node. No GPU: no labels. `per_gpu` (what each GPU
    offers: mig, mps, time-slicing or whole, and its replicas) adds
    `nodeagent.io/gpu.<index>.sharing` and `.replicas`; GFD's keys keep GFD's node-level
    meaning."""
    if not inventory.gpus:
        return {}
    first: Gpu = inventory.gpus[0]
    cuda = inventory.cuda_driver_version
    labels = {
        "gpu.count": str(len(inventory.gpus)),
        "gpu.product": _value(first.name),
        "gpu.memory": str(first.memory_total_bytes // (1024 * 1024)),
        "gpu.family": first.architecture,
        "gpu.compute.major": str(first.compute_capability[0]),
        "gpu.compute.minor": str(first.compute_capability[1]),
        "cuda.driver-version.major": str(cuda // 1000),
        "cuda.driver-version.minor": str(cuda % 1000 // 10),
        "cuda.driver-version.revision": str(cuda % 10),
        "mig.capable": _bool(any(g.mig_capable for g in inventory.gpus)),
        "mig.strategy": "mixed",
        # True only where nodeagent runs MPS: NVIDIA's Helm chart schedules its own MPS daemon
        # on this label, and two daemons must never serve one GPU.
        "mps.capable": _bool(sharing.strategy == "mps"),
        "gpu.sharing-strategy": sharing.strategy,
        "gpu.replicas": str(sharing.replicas if sharing.strategy != "none" else 1),
    }
    counts: dict[str, int] = {}
    details: dict[str, dict[str, str]] = {}
    for gpu in inventory.gpus:
        # A GI left without its compute instance (an interrupted apply) is not usable: never
        # advertised; the next apply completes it.
        gis = {s.gi_id: s for s in gpu.slices if s.ci_id is not None}
        for s in gis.values():
            counts[s.profile] = counts.get(s.profile, 0) + 1
            p = gpu.profile_by_id(s.profile_id)
            if p is None or s.profile in details:
                continue
            details[s.profile] = {
                "memory": str(p.memory_bytes // (1024 * 1024)),
                "multiprocessors": str(p.multiprocessor_count),
                "slices.gi": str(p.slice_count),
                "slices.ci": str(p.slice_count),
                "engines.copy": str(p.engines.copy),
                "engines.decoder": str(p.engines.decoder),
                "engines.encoder": str(p.engines.encoder),
                "engines.jpeg": str(p.engines.jpeg),
                "engines.ofa": str(p.engines.ofa),
            }
    for profile in sorted(counts):
        base = profile_label(profile)
        labels[f"{base}.count"] = str(counts[profile])
        for key, value in details.get(profile, {}).items():
            labels[f"{base}.{key}"] = value
    out = {prefix + k: v for k, v in sorted(labels.items())}
    for index, (strategy, replicas) in sorted((per_gpu or {}).items()):
        out[f"{GPU_SHARING_PREFIX}{index}.sharing"] = strategy
        out[f"{GPU_SHARING_PREFIX}{index}.replicas"] = str(replicas)
    return out


def slice_usage(inventory: Inventory, in_use: dict[str, str] | None = None) -> str:
    """Free and used slices per profile (changes with every pod): one annotation, as JSON."""
    in_use = in_use or {}
    usage: dict[str, dict[str, int]] = {}
    for gpu in inventory.gpus:
        for s in gpu.slices:
            used = s.in_use or (s.mig_uuid is not None and s.mig_uuid in in_use)
            entry = usage.setdefault(s.profile, {"free": 0, "used": 0})
            state = "incomplete" if s.ci_id is None else "used" if used else "free"
            entry[state] = entry.get(state, 0) + 1
    return json.dumps(dict(sorted(usage.items())), separators=(",", ":"))
