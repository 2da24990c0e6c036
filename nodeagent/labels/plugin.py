"""NVIDIA's device plugin config, written for the per-GPU sharing nodeagent runs.

The plugin applies one strategy and one replica count per shared resource to the GPUs it
lists (k8s-device-plugin api/config/v1; per-GPU replicas were refused upstream: #1786, PR #1787
closed): with any GPU under MPS it uses MPS and gives every MPS resource all GPUs; time-slicing
honours a `devices` list. So the file says what the plugin can express, and what it cannot is
returned as warnings (logged and shown): a node with MPS *and* time-sliced GPUs, or
time-sliced GPUs with different replica counts (the largest is used). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESOURCE = "nvidia.com/gpu"


def plugin_config(
    offers: Mapping[int, tuple[str, int]], resource: str = RESOURCE
) -> tuple[dict[str, Any], list[str]]:
    """The plugin's config (version v1) for what each GPU offers, and what it cannot say."""
    mps = {i: n for i, (strategy, n) in offers.items() if strategy == "mps"}
    sliced = {i: n for i, (strategy, n) in offers.items() if strategy == "time-slicing"}
    warnings: list[str] = []
    sharing: dict[str, Any] = {}
    if mps:
        sharing["mps"] = {"resources": [{"name": resource, "replicas": max(mps.values())}]}
        if sliced:
            warnings.append(
                f"GPUs {sorted(sliced)} are time-sliced, but NVIDIA's device plugin uses MPS for"
                " every GPU once one is under MPS: it does not time-slice them"
            )
    elif sliced:
        replicas = max(sliced.values())
        if len(set(sliced.values())) > 1:
            warnings.append(
                f"time-sliced GPUs ask for {sorted(set(sliced.values()))} replicas; the device"
                f" plugin takes one count for a resource: {replicas}"
            )
        sharing["timeSlicing"] = {
            "resources": [{"name": resource, "replicas": replicas, "devices": sorted(sliced)}]
        }
    return {"version": "v1", "sharing": sharing}, warnings
