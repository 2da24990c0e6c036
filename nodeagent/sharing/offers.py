"""What each GPU offers, as published: MIG (read from NVML), MPS (the daemon's GPUs),
time-slicing (only the sharing config says so: nothing on a GPU does), or whole."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

from nodeagent.mps.intent import MigMode
from nodeagent.nvml.inventory import Inventory
from nodeagent.sharing.deviceplugin import Offer as Offer
from nodeagent.sharing.resolve import GpuIntent


def planned_offers(
    inventory: Inventory,
    desired: Mapping[int, MigMode] | None,
    intents: Mapping[int, GpuIntent] | None,
    mps_devices: Set[int],
    mps_replicas: int,
) -> dict[int, Offer]:
    """What each GPU will offer once a run's plan is applied (as `Offers.update` will then
    publish it): a sharing config's intent, else MIG as the MIG config leaves it, MPS where
    the daemon will serve, whole elsewhere. Pure."""
    offers: dict[int, Offer] = {}
    for gpu in inventory.gpus:
        i = gpu.index
        wanted = desired.get(i) if desired else None
        mig = wanted.mig_enabled if wanted is not None else gpu.mig_current or gpu.mig_pending
        if intents and i in intents:
            offers[i] = (intents[i].strategy, intents[i].replicas)
        elif mig:
            offers[i] = ("mig", 1)
        elif i in mps_devices:
            offers[i] = ("mps", mps_replicas)
        else:
            offers[i] = ("whole", 1)
    return offers


class Offers:
    """The offers last published, kept between runs: time-slicing is remembered from the last
    sharing config resolved until a run wants no sharing config at all. Each update is handed
    to `publish` too (the agent's: its snapshot store, which the metrics read)."""

    def __init__(
        self, publish: Callable[[Mapping[int, Offer]], None] = lambda _offers: None
    ) -> None:
        self.publish = publish
        self.per_gpu: dict[int, Offer] = {}
        self._time_sliced: dict[int, int] = {}

    def update(
        self,
        inventory: Inventory,
        intents: Mapping[int, GpuIntent] | None,
        sharing_wanted: bool,
        mps_devices: tuple[int, ...],
        mps_replicas: int,
    ) -> dict[int, Offer]:
        """The offers now (also kept in `per_gpu`). `intents`: the sharing config this run
        applied, if any; `sharing_wanted`: whether a sharing config is wanted (one that failed,
        refused or not, keeps the time-slicing last published)."""
        if intents is not None:
            self._time_sliced = {
                i: it.replicas for i, it in intents.items() if it.strategy == "time-slicing"
            }
        elif not sharing_wanted:
            self._time_sliced = {}
        offers: dict[int, Offer] = {}
        for gpu in inventory.gpus:
            i = gpu.index
            if gpu.mig_current:
                offers[i] = ("mig", 1)
            elif i in mps_devices:
                offers[i] = ("mps", mps_replicas)
            elif i in self._time_sliced:
                offers[i] = ("time-slicing", self._time_sliced[i])
            else:
                offers[i] = ("whole", 1)
        self.per_gpu = offers
        self.publish(offers)
        return offers
