"""NVIDIA's device plugin config, written for the per-GPU sharing nodeagent runs.

What the plugin does with its config (k8s-device-plugin 1b826ac): every full GPU is one device
of `nvidia.com/gpu` (internal/rm/device_map.go); MIG devices are `nvidia.com/mig-<profile>`
under the mixed MIG strategy, `nvidia.com/gpu` under single, and a MIG-enabled GPU is a full GPU
under none. A sharing resource replicates *every* device of its name: the `devices` list is
reset to all with a warning (api/config/v1/replicas.go, `disableResoureRenaming`), so one
strategy and one replica count hold for all of `nvidia.com/gpu`; with `sharing.mps` set the
time-slicing section is ignored (api/config/v1/sharing.go), and the plugin refuses to start
when any of its resources holds a MIG device ("sharing using MPS is not supported for MIG
devices", internal/plugin/mps.go). Per-GPU replicas were refused upstream (#1786, PR #1787).

So a node's sharing is served exactly or not at all: `advertised` says what the plugin will
advertise for what each GPU offers, or why it cannot (`problem`); `plugin_config` writes it
(with the MIG strategy the labels use) and refuses the rest; `check_served` is the pipeline's
plan-step check where the plugin serves the node (`serves_through_plugin`): a GPU meant to stay
whole is never shared behind the user's back. `DevicePluginConfigSink` writes the file
(sharing.plugin-config-out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.base.errors import AgentError, ConfigError
from nodeagent.base.files import write_if_changed
from nodeagent.base.logs import get_logger
from nodeagent.mps.intent import mps_layout
from nodeagent.mps.layout import DEVICE_PLUGIN
from nodeagent.settings import Settings

RESOURCE = "nvidia.com/gpu"
PLUGIN_STRATEGY = {"whole": "none", "time-slicing": "time-slicing", "mps": "mps"}
log = get_logger("nodeagent.sharing")

Offer = tuple[str, int]  # (strategy, replicas): mig | mps | time-slicing | whole


@dataclass(frozen=True)
class Advertised:
    """How the plugin shares `nvidia.com/gpu`: strategy none | time-slicing | mps, replicas
    per device; `problem`: why it cannot serve the offers as they are (then none, 1)."""

    strategy: str = "none"
    replicas: int = 1
    problem: str | None = None


def _gpus(indices: list[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(map(str, sorted(indices)))


def _show(offer: Offer) -> str:
    strategy, replicas = offer
    return f"{strategy} x{replicas}" if strategy in ("mps", "time-slicing") else strategy


def advertised(offers: Mapping[int, Offer], mig_strategy: str = "mixed") -> Advertised:
    """What the plugin advertises as `nvidia.com/gpu` for what each GPU offers. Its devices
    are the full GPUs, and the MIG ones too (as unshared devices) unless the strategy is
    mixed; they must all offer the same, and MPS must not meet MIG on the node. Pure."""
    mig = [i for i, (strategy, _) in offers.items() if strategy == "mig"]
    mps = [i for i, (strategy, _) in offers.items() if strategy == "mps"]
    if mps and mig:
        return Advertised(
            problem=f"NVIDIA's device plugin does not serve MPS on a node with MIG devices"
            f" ('sharing using MPS is not supported for MIG devices'), and {_gpus(mig)} would"
            f" have MIG while {_gpus(mps)} would be under MPS: put them on different nodes"
        )
    full = [i for i, (strategy, _) in offers.items() if strategy != "mig"]
    if mig_strategy == "single" and mig and full:
        return Advertised(
            problem=f"NVIDIA's device plugin does not start under the single MIG strategy with"
            f" MIG on some GPUs only ('all devices on the node must be configured with the same"
            f" migEnabled value'), and {_gpus(mig)} would have MIG while {_gpus(full)} would"
            " not: use the mixed strategy (labels.mig-strategy) or MIG on every GPU"
        )
    members: dict[Offer, list[int]] = {}
    for i, offer in sorted(offers.items()):
        if offer[0] == "mig":
            if mig_strategy == "mixed":
                continue  # nvidia.com/mig-<profile>, never replicated by nodeagent's config
            offer = ("whole", 1)
        members.setdefault(offer, []).append(i)
    if len(members) > 1:
        told = "; ".join(f"{_gpus(gpus)} {_show(offer)}" for offer, gpus in members.items())
        return Advertised(
            problem=f"NVIDIA's device plugin shares every GPU it advertises as {RESOURCE} the"
            f" same way (its config's devices list is ignored), so it cannot serve {told}:"
            " give those GPUs one sharing, or make the ones to keep apart MIG"
        )
    if not members:
        return Advertised()
    ((strategy, replicas),) = members
    return Advertised(PLUGIN_STRATEGY[strategy], replicas)


def plugin_config(offers: Mapping[int, Offer], mig_strategy: str = "mixed") -> dict[str, Any]:
    """The plugin's config (version v1) that makes it advertise what each GPU offers, with
    the MIG strategy the labels use. Raises ConfigError (one sentence) where it cannot."""
    got = advertised(offers, mig_strategy)
    if got.problem is not None:
        raise ConfigError(got.problem)
    sharing: dict[str, Any] = {}
    if got.strategy != "none":
        key = "mps" if got.strategy == "mps" else "timeSlicing"
        sharing[key] = {"resources": [{"name": RESOURCE, "replicas": got.replicas}]}
    if got.strategy == "mps" and mig_strategy == "mixed":
        # The plugin refuses to start with MPS under mixed ('using --mig-strategy=mixed is not
        # supported with MPS'); with MPS there is no MIG GPU (above), and `none` advertises
        # the same full GPUs.
        mig_strategy = "none"
    return {"version": "v1", "flags": {"migStrategy": mig_strategy}, "sharing": sharing}


def serves_through_plugin(offers: Mapping[int, Offer], settings: Settings) -> bool:
    """Whether NVIDIA's device plugin serves these offers as nodeagent makes them: the agent
    writes its config (sharing.plugin-config-out), or runs MPS in its layout."""
    if settings.sharing.plugin_config_out is not None:
        return True
    mps = any(strategy == "mps" for strategy, _ in offers.values())
    return mps and mps_layout(settings.mps, settings.kube.enabled) == DEVICE_PLUGIN


def check_served(offers: Mapping[int, Offer], settings: Settings) -> None:
    """Raises ConfigError (one sentence) when the plugin serves the node and cannot advertise
    what each GPU would offer."""
    if not serves_through_plugin(offers, settings):
        return
    problem = advertised(offers, settings.labels.mig_strategy).problem
    if problem is not None:
        raise ConfigError(problem)
    mps = sorted(i for i, (strategy, _) in offers.items() if strategy == "mps")
    if mps and mps_layout(settings.mps, settings.kube.enabled) != DEVICE_PLUGIN:
        raise ConfigError(
            f"{_gpus(mps)} would be under MPS, and NVIDIA's device plugin serves MPS only from a"
            f" daemon in its layout (<root>/{RESOURCE}/pipe), but mps.layout is"
            f" {settings.mps.layout!r} here: set mps.layout to device-plugin"
        )


class DevicePluginConfigSink:
    """Writes the device plugin's config for what each GPU offers (`offers()`, as published
    with the labels) to `path()`, when one is set; a file that already says so is left alone.
    Offers the plugin cannot serve leave the file as it was and fail the publish."""

    name = "device-plugin-config"

    def __init__(
        self,
        path: Callable[[], Path | None],
        offers: Callable[[], Mapping[int, Offer]],
        mig_strategy: Callable[[], str] = lambda: "mixed",
    ) -> None:
        self.path = path
        self.offers = offers
        self.mig_strategy = mig_strategy

    def publish(self, labels: Mapping[str, str], snapshot: object) -> None:
        """Raises AgentError when the file cannot be written, ConfigError when the plugin
        cannot serve the offers."""
        path = self.path()
        if path is None:
            return
        import yaml

        document = plugin_config(self.offers(), self.mig_strategy())
        text = yaml.safe_dump(document, sort_keys=False)
        try:
            if not write_if_changed(path, text, "the device plugin config", 0o644):
                return
        except OSError as err:
            raise AgentError(
                f"cannot write the device plugin config {path}: {err.strerror}"
            ) from err
        log.info("sharing.plugin_config.written", path=str(path))
