"""The device plugin config nodeagent writes, from the config side: read back as NVIDIA's plugin
reads it (k8s-device-plugin 1b826ac: a sharing resource replicates every device of its name,
`devices` is always all; MIG devices are their own resources under the mixed strategy,
`nvidia.com/gpu` under single, full GPUs under none; MPS wins over time-slicing), every GPU gets
exactly the replicas nodeagent's per-GPU labels give it; what it cannot express is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.sharing.deviceplugin import Offer, advertised, plugin_config

STRATEGIES = ("none", "single", "mixed")
SERVED: dict[str, dict[int, Offer]] = {
    "all whole": {0: ("whole", 1), 1: ("whole", 1)},
    "all time-sliced": {0: ("time-slicing", 4), 1: ("time-slicing", 4)},
    "all MPS": {0: ("mps", 3), 1: ("mps", 3)},
    "one GPU time-sliced": {0: ("time-slicing", 8)},
    "all MIG": {0: ("mig", 1), 1: ("mig", 1)},
}
SERVED_MIXED: dict[str, dict[int, Offer]] = {  # MIG devices are resources of their own
    "MIG beside time-slicing": {0: ("mig", 1), 1: ("time-slicing", 2), 2: ("time-slicing", 2)},
    "MIG beside whole": {0: ("mig", 1), 1: ("whole", 1)},
}
REFUSED: dict[str, tuple[dict[int, Offer], str]] = {
    "time-sliced beside whole": (
        {0: ("time-slicing", 4), 1: ("whole", 1)},
        "cannot serve GPU 0 time-slicing x4; GPU 1 whole",
    ),
    "two replica counts": (
        {0: ("time-slicing", 4), 1: ("time-slicing", 2), 2: ("time-slicing", 4)},
        "cannot serve GPUs 0, 2 time-slicing x4; GPU 1 time-slicing x2",
    ),
    "MPS beside time-slicing": (
        {0: ("mps", 2), 1: ("time-slicing", 2)},
        "cannot serve GPU 0 mps x2; GPU 1 time-slicing x2",
    ),
    "MPS beside whole": (
        {0: ("mps", 2), 1: ("whole", 1)},
        "cannot serve GPU 0 mps x2; GPU 1 whole",
    ),
    "MPS beside MIG": (
        {0: ("mig", 1), 1: ("mps", 2)},
        "does not serve MPS on a node with MIG devices",
    ),
}


def devices_per_gpu(
    document: Mapping[str, Any], offers: Mapping[int, Offer], mig_strategy: str
) -> dict[int, int]:
    """How many `nvidia.com/gpu` devices the plugin advertises per GPU for this config: each
    device of the resource, replicated by the active sharing's replicas (every device: the
    plugin resets `devices` to all). A MIG GPU under mixed adds none (its slices are
    `nvidia.com/mig-*`); under single each of its slices is a device, counted here as one."""
    mps = "mps" in document["sharing"]
    # Under MPS the plugin takes `none` (it refuses mixed with MPS); no GPU has MIG then.
    expected = "none" if mps and mig_strategy == "mixed" else mig_strategy
    assert document["flags"] == {"migStrategy": expected}
    sharing = document["sharing"]
    active = sharing.get("mps") or sharing.get("timeSlicing") or {"resources": []}
    replicas = {r["name"]: r["replicas"] for r in active["resources"]}
    assert all(r.get("devices", "all") == "all" for r in active["resources"])
    return {
        i: replicas.get("nvidia.com/gpu", 1)
        for i, (strategy, _) in offers.items()
        if strategy != "mig" or mig_strategy != "mixed"
    }


def _labelled(offers: Mapping[int, Offer], mig_strategy: str) -> dict[int, int]:
    return {
        i: n for i, (strategy, n) in offers.items() if strategy != "mig" or mig_strategy != "mixed"
    }


@pytest.mark.parametrize("mig_strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(SERVED))
def test_every_gpu_gets_the_replicas_its_labels_say(name: str, mig_strategy: str) -> None:
    offers = SERVED[name]
    document = plugin_config(offers, mig_strategy)
    assert document["version"] == "v1"
    assert devices_per_gpu(document, offers, mig_strategy) == _labelled(offers, mig_strategy)


@pytest.mark.parametrize("name", sorted(SERVED_MIXED))
def test_mig_resources_stand_apart_under_the_mixed_strategy(name: str) -> None:
    offers = SERVED_MIXED[name]
    document = plugin_config(offers, "mixed")
    assert devices_per_gpu(document, offers, "mixed") == _labelled(offers, "mixed")


@pytest.mark.parametrize(
    ("mig_strategy", "words"),
    [
        ("none", "GPU 0 whole; GPU 1 time-slicing x2"),  # a MIG GPU is a full GPU there
        ("single", "GPU 0 would have MIG while GPU 1 would not"),  # the plugin does not start
    ],
)
def test_mig_beside_full_gpus_is_refused_where_mig_is_nvidia_com_gpu(
    mig_strategy: str, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        plugin_config({0: ("mig", 1), 1: ("time-slicing", 2)}, mig_strategy)


@pytest.mark.parametrize("mig_strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_plugin_cannot_express_is_refused(name: str, mig_strategy: str) -> None:
    offers, words = REFUSED[name]
    with pytest.raises(ConfigError) as err:
        plugin_config(offers, mig_strategy)
    assert words in str(err.value)
    assert str(err.value).count(". ") == 0 and "\n" not in str(err.value)
    got = advertised(offers, mig_strategy)
    assert (got.strategy, got.replicas, got.problem) == ("none", 1, str(err.value))


@pytest.mark.parametrize(
    ("offers", "strategy", "replicas"),
    [
        ({0: ("mps", 4), 1: ("mps", 4)}, "mps", 4),
        ({0: ("time-slicing", 2)}, "time-slicing", 2),
        ({0: ("whole", 1)}, "none", 1),
        ({}, "none", 1),
    ],
)
def test_advertised_is_what_the_written_config_makes_the_plugin_say(
    offers: dict[int, Offer], strategy: str, replicas: int
) -> None:
    got = advertised(offers)
    assert (got.strategy, got.replicas, got.problem) == (strategy, replicas, None)
    sharing = plugin_config(offers)["sharing"]
    key = {"mps": "mps", "time-slicing": "timeSlicing"}.get(strategy)
    expected = {key: {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}
    assert sharing == (expected if key else {})
