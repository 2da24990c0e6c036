"""Labels that follow NVIDIA's device plugin config, as GFD reads it; which config a node runs
with (config-manager's rules); bad configs named by file:line:col."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.labels.devicepluginconfig import (
    DevicePluginConfigReader,
    choose,
    parse_plugin_config,
)
from nodeagent.labels.gfd import GfdOptions
from nodeagent.labels.render import SharingState, render_labels
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.settings import Labels
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.mig_apply import reconfigure

P = "nvidia.com/"


def inventory(spec: str = "h200x2", config: str | None = None) -> Inventory:
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "g")
        reconfigure(session, cfg, config, lib.reset)
    return read_inventory(session)


def labels_with(text: str, inv: Inventory | None = None, **kw: object) -> dict[str, str]:
    plugin = parse_plugin_config(text, "plugin.yaml")
    offers = kw.pop("offers", None)
    return render_labels(
        inv or inventory(), per_gpu=offers, gfd=GfdOptions("mixed"), plugin=plugin, **kw
    )  # type: ignore[arg-type]


def sharing(kind: str, name: str, replicas: int, extra: str = "") -> str:
    return (
        f"version: v1\nsharing:\n  {kind}:\n{extra}    resources:\n"
        f"    - name: {name}\n      replicas: {replicas}\n"
    )


# GFD's own table: k8s-device-plugin internal/lm/resource_test.go, TestGPUResourceLabeler
# (1b826acc): replicas, strategy and product suffix of nvidia.com/gpu for each config.
@pytest.mark.parametrize(
    ("config", "replicas", "strategy", "product"),
    [
        ("version: v1\n", "1", "none", "NVIDIA-H200"),  # no sharing
        (sharing("timeSlicing", "nvidia.com/not-gpu", 2), "1", "none", "NVIDIA-H200"),
        (sharing("timeSlicing", "nvidia.com/gpu", 2), "2", "time-slicing", "NVIDIA-H200-SHARED"),
        (
            sharing("timeSlicing", "nvidia.com/gpu", 2, "    renameByDefault: true\n"),
            "2",
            "time-slicing",
            "NVIDIA-H200",
        ),
        (sharing("mps", "nvidia.com/not-gpu", 2), "1", "none", "NVIDIA-H200"),
        (sharing("mps", "nvidia.com/gpu", 2), "2", "mps", "NVIDIA-H200-SHARED"),
        (sharing("mps", "gpu", 2, "    renameByDefault: true\n"), "2", "mps", "NVIDIA-H200"),
        # failRequestsGreaterThanOne changes what the plugin allocates, no label.
        (
            sharing("mps", "gpu", 4, "    failRequestsGreaterThanOne: false\n"),
            "4",
            "mps",
            "NVIDIA-H200-SHARED",
        ),
        ("", "1", "none", "NVIDIA-H200"),  # config-manager's empty config (/dev/null)
    ],
)
def test_full_gpus_follow_the_plugin_config(
    config: str, replicas: str, strategy: str, product: str
) -> None:
    labels = labels_with(config)
    assert labels[P + "gpu.replicas"] == replicas
    assert labels[P + "gpu.sharing-strategy"] == strategy
    assert labels[P + "gpu.product"] == product
    # GFD: true where the config shares with MPS at all, whichever resource it names.
    assert labels[P + "mps.capable"] == ("true" if "mps:" in config else "false")


def test_mps_wins_over_time_slicing_as_in_gfd() -> None:
    both = (
        sharing("mps", "gpu", 3)
        + "  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 8}\n"
    )
    labels = labels_with(both)
    assert (labels[P + "gpu.replicas"], labels[P + "gpu.sharing-strategy"]) == ("3", "mps")


def test_mixed_strategy_shares_the_mig_resources_the_config_lists() -> None:
    inv = inventory("h200", "all-1g.18gb")
    labels = labels_with(sharing("timeSlicing", "nvidia.com/mig-1g.18gb", 3), inv)
    assert labels[P + "mig-1g.18gb.replicas"] == "3"
    assert labels[P + "mig-1g.18gb.sharing-strategy"] == "time-slicing"
    assert labels[P + "mig-1g.18gb.product"] == "NVIDIA-H200-MIG-1g.18gb-SHARED"
    assert labels[P + "gpu.replicas"] == "0"  # MIG-enabled GPUs: sharing disabled, as GFD


def test_single_strategy_shares_nvidia_com_gpu_made_of_mig_devices() -> None:
    inv = inventory("h200", "all-1g.18gb")
    text = "version: v1\nflags:\n  migStrategy: single\n" + sharing("timeSlicing", "gpu", 2)[12:]
    labels = labels_with(text, inv)
    assert labels[P + "mig.strategy"] == "single"
    assert labels[P + "gpu.product"] == "NVIDIA-H200-MIG-1g.18gb-SHARED"
    assert (labels[P + "gpu.replicas"], labels[P + "gpu.sharing-strategy"]) == ("2", "time-slicing")
    assert labels[P + "gpu.count"] == "7"


def test_the_plugin_config_mig_strategy_decides() -> None:
    labels = labels_with(
        "version: v1\nflags:\n  migStrategy: none\n", inventory("h200", "all-1g.18gb")
    )
    assert P + "mig.strategy" not in labels
    assert not any(k.startswith(P + "mig-") for k in labels)


def test_mps_on_a_mig_enabled_gpu_is_refused_as_gfd_does() -> None:
    with pytest.raises(ConfigError, match=r"plugin.yaml shares GPUs with MPS.*\(GPU 0\)"):
        labels_with(sharing("mps", "gpu", 2), inventory("h200", "all-1g.18gb"))


@pytest.mark.parametrize(
    ("offers", "sharing_state", "replicas", "strategy"),
    [
        # GPUs shared differently: GFD's node-wide labels say none (per GPU in gpu.<i>.*)
        ({0: ("time-slicing", 3), 1: ("whole", 1)}, SharingState(), "1", "none"),
        ({0: ("time-slicing", 3), 1: ("time-slicing", 3)}, SharingState(), "3", "time-slicing"),
        ({0: ("mps", 2), 1: ("mps", 2)}, SharingState("mps", 2), "2", "mps"),
        ({0: ("whole", 1), 1: ("whole", 1)}, SharingState(), "8", "time-slicing"),
    ],
)
def test_nodeagents_own_sharing_wins(
    offers: dict[int, tuple[str, int]], sharing_state: SharingState, replicas: str, strategy: str
) -> None:
    labels = labels_with(sharing("timeSlicing", "gpu", 8), offers=offers, sharing=sharing_state)
    assert (labels[P + "gpu.replicas"], labels[P + "gpu.sharing-strategy"]) == (replicas, strategy)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (sharing("timeSlicing", "gpu", 1), r"plugin.yaml:6:17: .*replicas must be a number >= 2"),
        (sharing("mps", "gpu", "two"), r"plugin.yaml:6:17: .*replicas must be"),  # type: ignore[arg-type]
        ("version: v2\n", r"plugin.yaml:1:10: unknown version"),
        ("version: v1\nsharing:\n  timeSlicing: {}\n", r"plugin.yaml:3:16: .*resources must list"),
        ("version: v1\nflags:\n  migStrategy: half\n", r"plugin.yaml:3:16: flags.migStrategy"),
        (
            sharing("timeSlicing", "example.com/gpu", 2),
            r"plugin.yaml:5:13: .*name must be a resource name",
        ),
        (
            sharing("mps", "gpu", 2, "    renameByDefault: maybe\n"),
            r"plugin.yaml:4:22: .*renameByDefault must be true or false",
        ),
        ("version: [v1\n", r"plugin.yaml:2:1: not valid YAML"),
    ],
)
def test_a_bad_config_is_one_sentence_with_its_position(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_plugin_config(text, "plugin.yaml")


def test_unknown_keys_are_the_plugins_business() -> None:
    text = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\nimex: {}\n"
    assert parse_plugin_config(text, "p").sharing.strategy == "none"


# -- which config: config-manager's rules --------------------------------------------------


def folder(tmp_path: Path, *names: str) -> Path:
    d = tmp_path / "available-configs"
    d.mkdir()
    for name in names:
        (d / name).write_text(sharing("timeSlicing", "gpu", 2 + len(name)))
    (d / "..data").mkdir()  # a mounted ConfigMap's bookkeeping: never a config
    return d


def settings(d: Path, **kw: object) -> Labels:
    return dataclasses.replace(Labels(), device_plugin_config_dir=d, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("names", "label", "default", "fallbacks", "chosen"),
    [
        (("a", "bb"), "bb", "a", ("named", "single"), "bb"),  # the label first
        (("a", "bb"), None, "a", ("named", "single"), "a"),  # then the default
        (("a", "default"), None, None, ("named", "single"), "default"),
        (("a",), None, None, ("named", "single"), "a"),  # the only one
        (("a", "bb"), None, None, ("single", "empty"), None),  # empty: no config
    ],
)
def test_the_config_chosen(
    tmp_path: Path,
    names: tuple[str, ...],
    label: str | None,
    default: str | None,
    fallbacks: tuple[str, ...],
    chosen: str | None,
) -> None:
    d = folder(tmp_path, *names)
    s = settings(
        d, device_plugin_default_config=default, device_plugin_fallback_strategies=fallbacks
    )
    assert choose(s, label) == (str(d / chosen) if chosen else None)


@pytest.mark.parametrize(
    ("names", "label", "default", "error"),
    [
        (("a",), "b", None, r"node label nvidia.com/device-plugin.config names .*'b'.*holds a\)"),
        (("a",), None, "b", r"labels.device-plugin-default-config names .*'b'"),
        (("a", "bb"), None, None, r"no device plugin config is chosen"),
        ((), None, None, r"holds no config"),
    ],
)
def test_no_config_is_one_sentence(
    tmp_path: Path, names: tuple[str, ...], label: str | None, default: str | None, error: str
) -> None:
    s = settings(folder(tmp_path, *names), device_plugin_default_config=default)
    with pytest.raises(ConfigError, match=error):
        choose(s, label)


def test_the_reader_follows_the_label_and_the_file(tmp_path: Path) -> None:
    d = folder(tmp_path, "a", "bb")
    reader = DevicePluginConfigReader()
    s = settings(d)
    first = reader.read(s, "a")
    assert first is not None and dict(first.sharing.replicas) == {"gpu": 3}
    second = reader.read(s, "bb")
    assert second is not None and dict(second.sharing.replicas) == {"gpu": 4}
    (d / "bb").write_text(sharing("mps", "gpu", 6) + "# changed\n")
    third = reader.read(s, "bb")
    assert third is not None and (third.sharing.strategy, dict(third.sharing.replicas)) == (
        "mps",
        {"gpu": 6},
    )
    assert reader.read(Labels(), "a") is None  # no plugin config set: nothing read


def test_config_managers_empty_config_is_a_link_to_dev_null(tmp_path: Path) -> None:
    """config-manager's `empty` fallback points the plugin's (and GFD's) file at /dev/null."""
    link = tmp_path / "config.yaml"
    link.symlink_to("/dev/null")
    s = dataclasses.replace(Labels(), device_plugin_config_file=link)
    found = DevicePluginConfigReader().read(s, None)
    assert found is not None and found.sharing.strategy == "none"
