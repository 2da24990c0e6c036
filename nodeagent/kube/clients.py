"""GPU clients around a MIG change, as NVIDIA's mig-manager does it: set each component's
GPU-operator deploy label `nvidia.com/gpu.deploy.<name>` to `paused-for-mig-change`, wait until
its pods left this node, and put the labels back afterwards; then restart the pods that must see
the new slices. Restoring always runs, whatever failed in between: a node is never left paused.

Parity with mig-parted's `pkg/mig/reconfigure` (NVIDIA/mig-parted bd7160f4):

- the default set is mig-manager's: device-plugin, gpu-feature-discovery, dcgm-exporter, dcgm,
  nvsm, and `client` (third-party GPU clients) where the node carries that label;
- a label set to `false` is left alone: not paused, and not turned into `true` afterwards;
- the pods waited for are the DaemonSet pods on this node whose nodeSelector names a paused
  label (mig-manager does this for `gpu.deploy.client`; the operator's own DaemonSets select on
  their label too), plus any pods matching a selector given with the component.

Deliberately different: an absent label is not touched (mig-manager pauses it and then writes
`true`, which would start a component the node never ran; the operator adds the label to GPU
nodes itself), and a label is restored to the value it had, not always to `true`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.base.errors import AgentError, KubeError
from nodeagent.base.logs import get_logger
from nodeagent.kube.api import NodeApi

log = get_logger("nodeagent.kube")
DEPLOY_LABEL = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
UNTOUCHED = ("", "false")  # no component deployed by this label here: leave it as it is


@dataclass(frozen=True)
class ClientSettings:
    # component -> label selector of its pods ({}: only DaemonSet pods selecting its label)
    pause: dict[str, dict[str, str]] = field(default_factory=dict)
    # label selectors of pods on this node to delete after the change (they restart)
    restart: tuple[dict[str, str], ...] = ()
    wait_seconds: float = 300.0
    poll_seconds: float = 2.0


def to_pause(labels: Mapping[str, str], components: Mapping[str, Any]) -> dict[str, str]:
    """Deploy label -> the value to restore, for the components that are to be paused. Absent
    and `false` labels are not paused. A label still paused by an interrupted change was a
    running component: it is restored to `true` (what mig-manager does)."""
    out = {}
    for name in sorted(components):
        key = DEPLOY_LABEL + name
        value = labels.get(key)
        if value is None or value in UNTOUCHED:
            continue
        out[key] = "true" if value == PAUSED else value
    return out


def _selects(pod: Mapping[str, Any], keys: set[str]) -> bool:
    """A DaemonSet's pod whose nodeSelector names one of `keys`: it leaves once its label
    changes (what mig-manager waits for, `waitForPodsWithNodeSelector`)."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    owners = meta.get("ownerReferences") or []
    if not any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners):
        return False
    return bool(keys & set(spec.get("nodeSelector") or {}))


class GpuClients:
    def __init__(
        self,
        api: NodeApi,
        settings: ClientSettings,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.settings = settings
        self.sleep = sleep
        self.clock = clock
        self.paused: dict[str, str] = {}  # deploy label -> value to restore

    def pause(self) -> None:
        """Set each component's deploy label to paused and wait until its pods left this node.
        Raises KubeError on timeout; `restore()` undoes whatever was paused, in every case."""
        if not self.settings.pause:
            return
        labels = self.api.get_node().get("metadata", {}).get("labels") or {}
        restore = to_pause(labels, self.settings.pause)
        skipped = sorted(set(self.settings.pause) - {k[len(DEPLOY_LABEL) :] for k in restore})
        if skipped:
            log.info("clients.not_deployed", components=skipped)
        if not restore:
            return
        self.paused = restore  # before the write: a failed write is restored too
        self.api.patch_node({"metadata": {"labels": dict.fromkeys(restore, PAUSED)}})
        log.info("clients.paused", labels=sorted(restore))
        self._wait_gone(set(restore))

    def _wait_gone(self, keys: set[str]) -> None:
        deadline = self.clock() + self.settings.wait_seconds
        selectors = {
            name: sel
            for name, sel in sorted(self.settings.pause.items())
            if sel and DEPLOY_LABEL + name in keys
        }
        while left := self._still_running(keys, selectors):
            if self.clock() >= deadline:
                raise KubeError(
                    "GPU clients did not leave the node within"
                    f" {self.settings.wait_seconds:g} s: {'; '.join(left)} still run"
                )
            self.sleep(self.settings.poll_seconds)

    def _still_running(self, keys: set[str], selectors: dict[str, dict[str, str]]) -> list[str]:
        """What still runs here, in words: 'device-plugin pods ns/a, ns/b'."""
        found: dict[str, list[str]] = {}
        for pod in self.api.list_pods_on_node():
            meta = pod.get("metadata", {})
            where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            selected = set((pod.get("spec") or {}).get("nodeSelector") or {}) & keys
            if _selects(pod, keys):
                for key in sorted(selected):
                    found.setdefault(key[len(DEPLOY_LABEL) :], []).append(where)
                continue
            labels = meta.get("labels") or {}
            for name, sel in selectors.items():
                if all(labels.get(k) == v for k, v in sel.items()):
                    found.setdefault(name, []).append(where)
        return [f"{name} pods {', '.join(pods)}" for name, pods in sorted(found.items())]

    def restore(self) -> None:
        """Put the deploy labels back as they were and restart the configured pods."""
        errors: list[str] = []
        if self.paused:
            try:
                self.api.patch_node({"metadata": {"labels": dict(self.paused)}})
                log.info("clients.restored", labels=sorted(self.paused))
                self.paused = {}
            except AgentError as err:
                errors.append(str(err))
        for selector in self.settings.restart:
            try:
                for ns, name in self.api.pods_on_node(selector):
                    self.api.delete_pod(ns, name)
                    log.info("clients.restarted", pod=f"{ns}/{name}")
            except AgentError as err:
                errors.append(str(err))
        if errors:
            raise KubeError("restoring GPU clients failed: " + "; ".join(errors))
