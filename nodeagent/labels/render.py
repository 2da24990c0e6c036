"""Node labels from an Inventory: GPU Feature Discovery's, and nodeagent's per-GPU sharing. Pure.

Names and values follow GFD (nodeagent.labels.gfd) so existing nodeSelectors keep working; the
prefix (default `nvidia.com/`) is configurable for clusters that also run GFD.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.base.errors import ConfigError
from nodeagent.labels.devicepluginconfig import DevicePluginConfig
from nodeagent.labels.gfd import GfdOptions, gfd_labels
from nodeagent.labels.replication import Replication, ResourceSharing
from nodeagent.nvml.inventory import Inventory
from nodeagent.sharing.deviceplugin import advertised

DEFAULT_PREFIX = "nvidia.com/"
GPU_SHARING_PREFIX = "nodeagent.io/gpu."


@dataclass(frozen=True)
class SharingState:
    """How the node's full GPUs are shared: 'none' or 'mps' with `replicas` clients each."""

    strategy: str = "none"
    replicas: int = 1


def replication(offers: Mapping[int, tuple[str, int]], mig_strategy: str = "mixed") -> Replication:
    """What the device plugin config nodeagent writes for these offers makes the plugin
    advertise as `nvidia.com/gpu` (GFD reads the plugin's config); none where it cannot
    serve them (the per-GPU labels say what each GPU offers)."""
    got = advertised(offers, mig_strategy)
    return Replication(got.strategy, got.replicas)


def render_labels(
    inventory: Inventory,
    sharing: SharingState = SharingState(),
    prefix: str = DEFAULT_PREFIX,
    per_gpu: Mapping[int, tuple[str, int]] | None = None,
    gfd: GfdOptions | None = None,
    plugin: DevicePluginConfig | None = None,
) -> dict[str, str]:
    """Every label nodeagent owns for this node. No GPU: no labels.

    GFD's labels for `gfd` (MIG strategy and machine type; default mixed and unknown).
    `mps.capable` is true only where nodeagent runs MPS (`sharing`): NVIDIA's Helm chart
    schedules its own MPS daemon on that label, and two daemons must never serve one GPU.
    `per_gpu` (what each GPU offers: mig, mps, time-slicing or whole, and its replicas) decides
    GFD's gpu.replicas and gpu.sharing-strategy as the device plugin config written for it
    would, and adds `nodeagent.io/gpu.<index>.sharing` and `.replicas`; without it they come
    from `sharing`.

    `plugin` (the device plugin's own config, nodeagent.labels.devicepluginconfig) decides them
    instead, as GFD reads it, where nodeagent shares no GPU itself: nodeagent's own sharing
    wins (its MPS daemon, or a sharing config that shares a GPU). Its flags.migStrategy, when
    given, is the MIG strategy (the plugin advertises MIG devices by it). Raises ConfigError
    for what GFD refuses: MPS in the plugin config on a node with a MIG-enabled GPU.
    """
    gfd = gfd or GfdOptions()
    rep: Replication | ResourceSharing
    if per_gpu is not None:
        rep = replication(per_gpu, gfd.mig_strategy)
    else:
        rep = Replication(sharing.strategy, sharing.replicas if sharing.strategy != "none" else 1)
    mps_capable = sharing.strategy == "mps"
    shared = mps_capable or any(s in ("mps", "time-slicing") for s, _ in (per_gpu or {}).values())
    if plugin is not None and not shared:
        rep, mps_capable = plugin.sharing, plugin.sharing.strategy == "mps"
        if plugin.mig_strategy is not None:
            gfd = dataclasses.replace(gfd, mig_strategy=plugin.mig_strategy)
        enabled = [g.index for g in inventory.gpus if g.mig_current]
        if mps_capable and enabled:
            raise ConfigError(
                f"device plugin config {plugin.source} shares GPUs with MPS, which the plugin"
                f" and GFD refuse on MIG-enabled GPUs (GPU {', '.join(map(str, enabled))})"
            )
    labels = gfd_labels(inventory, gfd, rep, mps_capable=mps_capable)
    out = {prefix + k: v for k, v in sorted(labels.items())}
    if labels:
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
