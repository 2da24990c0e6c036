"""YAML that mig-parted's parser (sigs.k8s.io/yaml over go-yaml v2, api/spec/v1) accepts is
accepted here too, read the same: YAML 1.1 booleans go-yaml has (y, n), merge keys, numbers
JSON takes as integers (7.0, 1e1), an empty mig-devices where MIG is off, an empty or
repeated device list."""

from __future__ import annotations

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import parse_config


def _entry(text: str) -> tuple[object, bool, dict[str, int]]:
    config = parse_config(f"version: v1\nmig-configs:\n  c:\n{text}", "f.yaml")
    (entry,) = config.configs["c"]
    return entry.devices, entry.mig_enabled, {p.name: p.count for p in entry.mig_devices}


ACCEPTED = {
    "bool-y": ("  - devices: all\n    mig-enabled: y\n    mig-devices: {1g.18gb: 7}\n",
               ("all", True, {"1g.18gb": 7})),
    "bool-N": ("  - devices: all\n    mig-enabled: N\n    mig-devices: {}\n", ("all", False, {})),
    "bool-on": ("  - devices: all\n    mig-enabled: on\n    mig-devices: {}\n", ("all", True, {})),
    "count-float": ("  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 7.0}\n",
                    ("all", True, {"1g.18gb": 7})),
    "count-exponent": ("  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 1e1}\n",
                       ("all", True, {"1g.18gb": 10})),
    "count-hex": ("  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 0x7}\n",
                  ("all", True, {"1g.18gb": 7})),
    # mig-parted accepts `devices: [1.0]` as GPU 1: sigs.k8s.io/yaml turns the YAML into JSON
    # (go-yaml reads 1.0 as float64 1, encoding/json writes it `1`), and api/spec/v1/spec.go's
    # MigConfigSpec.UnmarshalJSON then takes `[1]` into its []int. 0.5 stays an error (below).
    "index-float": ("  - devices: [0, 1.0]\n    mig-enabled: false\n    mig-devices: {}\n",
                    ((0, 1), False, {})),
    "devices-empty": ("  - devices: []\n    mig-enabled: false\n    mig-devices: {}\n", ((), False, {})),
    "devices-repeated": ("  - devices: [1, 1]\n    mig-enabled: false\n    mig-devices: {}\n",
                         ((1,), False, {})),
    "mig-devices-null-off": ("  - devices: all\n    mig-enabled: false\n    mig-devices:\n",
                             ("all", False, {})),
}  # fmt: skip


@pytest.mark.parametrize("case", ACCEPTED)
def test_yaml_mig_parted_accepts_is_read_as_it_reads_it(case: str) -> None:
    text, expected = ACCEPTED[case]
    assert _entry(text) == expected


def test_merge_keys_bring_in_defaults_and_own_keys_win() -> None:
    text = (
        "version: v1\nmig-configs:\n"
        "  all-1g:\n    - &on {devices: all, mig-enabled: true, mig-devices: {1g.18gb: 7}}\n"
        "  all-2g:\n    - <<: *on\n      mig-devices: {2g.35gb: 3}\n"
        "  first-two:\n    - <<: [*on]\n      devices: [0, 1]\n"
    )
    config = parse_config(text, "f.yaml")
    (two,) = config.configs["all-2g"]
    assert two.devices == "all" and two.mig_enabled
    assert [(p.name, p.count) for p in two.mig_devices] == [("2g.35gb", 3)]
    (first,) = config.configs["first-two"]
    assert first.devices == (0, 1) and [p.count for p in first.mig_devices] == [7]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("  - devices: all\n    mig-enabled: true\n    mig-devices:\n", "mig-devices is empty"),
        ("  - devices: all\n    mig-enabled: 'y'\n    mig-devices: {}\n", "mig-enabled must be"),
        ("  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 7.5}\n", "count of"),
        ("  - devices: [0.5]\n    mig-enabled: false\n    mig-devices: {}\n", "device index"),
        ("  - <<: 3\n    devices: all\n    mig-enabled: false\n", "'<<' merges a mapping"),
    ],
    ids=["null-devices-mig-on", "quoted-y", "fractional-count", "fractional-index", "merge-scalar"],
)
def test_what_mig_parted_refuses_stays_refused(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        _entry(text)


def test_a_merge_of_a_mapping_into_itself_is_an_error_not_a_recursion() -> None:
    text = "version: v1\nmig-configs: &top\n  <<: *top\n"
    with pytest.raises(ConfigError):
        parse_config(text, "f.yaml")
