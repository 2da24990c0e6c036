"""GPU clients around a MIG change: pause them (GPU-operator style deploy labels, waiting for
their pods to leave this node), then restore them and restart the pods that must see the new
slices. Restoring always runs, whatever failed in between: a node is never left paused."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nodeagent.errors import AgentError, KubeError
from nodeagent.kube.api import NodeApi
from nodeagent.logs import get_logger

log = get_logger("nodeagent.kube")
DEPLOY_LABEL = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"


@dataclass(frozen=True)
class ClientSettings:
    # component -> label selector of its pods, e.g. {"device-plugin": {"app": "nvidia-dp"}}
    pause: dict[str, dict[str, str]] = field(default_factory=dict)
    # label selectors of pods on this node to delete after the change (they restart)
    restart: tuple[dict[str, str], ...] = ()
    wait_seconds: float = 300.0
    poll_seconds: float = 2.0


def parse_selector(text: str) -> dict[str, str]:
    """'app=x,tier=y' -> {'app': 'x', 'tier': 'y'}; raises ValueError."""
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"selector {text!r} must be key=value[,key=value]")
        out[key.strip()] = value.strip()
    return out


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
        self.paused: dict[str, str | None] = {}  # deploy label -> value before the pause

    def pause(self) -> None:
        """Set each component's deploy label to paused and wait until its pods left this node.
        Raises KubeError on timeout; `restore()` undoes whatever was paused, in every case."""
        if not self.settings.pause:
            return
        labels = self.api.get_node().get("metadata", {}).get("labels") or {}
        # A label still paused by an interrupted change is not the value to restore.
        previous = {
            key: None if labels.get(key) == PAUSED else labels.get(key)
            for key in (DEPLOY_LABEL + c for c in self.settings.pause)
        }
        self.paused = previous  # before the write: a failed write is restored too
        self.api.patch_node({"metadata": {"labels": dict.fromkeys(previous, PAUSED)}})
        log.info("clients.paused", components=sorted(self.settings.pause))
        deadline = self.clock() + self.settings.wait_seconds
        for component, selector in sorted(self.settings.pause.items()):
            while pods := self.api.pods_on_node(selector):
                if self.clock() >= deadline:
                    raise KubeError(
                        "GPU clients did not leave the node within"
                        f" {self.settings.wait_seconds:g} s:"
                        f" {component} pods {', '.join(f'{ns}/{n}' for ns, n in pods)} still run"
                    )
                self.sleep(self.settings.poll_seconds)

    def restore(self) -> None:
        """Put the deploy labels back as they were and restart the configured pods."""
        errors: list[str] = []
        if self.paused:
            restored = {k: v or "true" for k, v in self.paused.items()}
            try:
                self.api.patch_node({"metadata": {"labels": restored}})
                self.paused = {}
                log.info("clients.restored", labels=sorted(restored))
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
