"""NVIDIA's device plugin config, written for the per-GPU sharing nodeagent runs.

The plugin applies one strategy and one replica count per shared resource to the GPUs it
lists (k8s-device-plugin api/config/v1; per-GPU replicas were refused upstream: #1786, PR #1787
closed): with any GPU under MPS it uses MPS and gives every MPS resource all GPUs; time-slicing
honours a `devices` list. So the file says what the plugin can express, and what it cannot is
returned as warnings (logged and shown): a node with MPS *and* time-sliced GPUs, or
time-sliced GPUs with different replica counts (the largest is used). `plugin_config` is
pure; `PluginConfigSink` is the pipeline's sink that writes it (sharing.plugin-config-out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nodeagent.errors import AgentError
from nodeagent.files import write_if_changed
from nodeagent.logs import get_logger

RESOURCE = "nvidia.com/gpu"
log = get_logger("nodeagent.sharing")


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


class PluginConfigSink:
    """Writes the device plugin's config for what each GPU offers (`offers()`, as published
    with the labels) to `path()`, when one is set; a file that already says so is left alone."""

    name = "device-plugin-config"

    def __init__(
        self,
        path: Callable[[], Path | None],
        offers: Callable[[], Mapping[int, tuple[str, int]]],
    ) -> None:
        self.path = path
        self.offers = offers

    def publish(self, labels: Mapping[str, str], snapshot: object) -> None:
        """Raises AgentError when the file cannot be written."""
        path = self.path()
        if path is None:
            return
        import yaml

        document, warnings = plugin_config(self.offers())
        for warning in warnings:
            log.warning("sharing.plugin_config", limitation=warning)
        text = yaml.safe_dump(document, sort_keys=False)
        try:
            if not write_if_changed(path, text, "the device plugin config", 0o644):
                return
        except OSError as err:
            raise AgentError(
                f"cannot write the device plugin config {path}: {err.strerror}"
            ) from err
        log.info("sharing.plugin_config.written", path=str(path))
