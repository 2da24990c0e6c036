"""The nodeagent/v1 sharing format: what parses, mig-parted files as MIG only, and a corpus of
bad files each with one clear error at its position."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import DeviceId
from nodeagent.sharing.config import (
    MigShare,
    MpsShare,
    SharingEntry,
    TimeSlicing,
    Whole,
    parse_sharing,
)

MIXED = """\
version: nodeagent/v1
sharing-configs:
  mixed:
    - devices: [0, 1]
      mig:
        mig-devices: {"1g.18gb": 4, "3g.71gb": 1}
    - devices: [2, 3]
      mps: {replicas: 4, thread-percentage: 25, pinned-memory: 32G}
    - devices: [4]
      time-slicing: {replicas: 4}
    - devices: [5, 6, 7]
      whole: {}
  balanced:
    - devices: all
      device-filter: ["0x233510DE", "0x20B010DE"]
      mig: {mig-config: all-balanced}
  plain:
    - devices: all
      whole:
"""


def test_mixed_file_parses() -> None:
    cfg = parse_sharing(MIXED, "s.yaml")
    assert cfg.mig_parted is False and cfg.source == "s.yaml"
    assert list(cfg.configs) == ["mixed", "balanced", "plain"]
    mig, mps, ts, whole = cfg.configs["mixed"]
    assert mig.devices == (0, 1) and mig.device_filter is None
    assert isinstance(mig.share, MigShare) and mig.share.mig_config is None
    assert [(p.name, p.count) for p in mig.share.profiles or ()] == [("1g.18gb", 4), ("3g.71gb", 1)]
    assert str(mig.mark) == "s.yaml:4:7" and str(mig.devices_mark) == "s.yaml:4:16"
    assert mps.share == MpsShare(4, 25, "32G")
    assert ts.share == TimeSlicing(4)
    assert whole.share == Whole() and whole.devices == (5, 6, 7)
    (balanced,) = cfg.configs["balanced"]
    assert balanced.share == MigShare(None, "all-balanced")
    assert balanced.devices == "all" and balanced.device_filter == (
        DeviceId(0x233510DE),
        DeviceId(0x20B010DE),
    )
    assert cfg.configs["plain"][0].share == Whole()


def test_mps_optional_fields_default_to_none() -> None:
    cfg = parse_sharing(_cfg("a:\n  - devices: [0]\n    mps: {replicas: 2}\n"), "s")
    assert cfg.configs["a"][0].share == MpsShare(2, None, None)


@pytest.mark.parametrize("size", ["2G", "2048M", "512MiB", "4GB", "1M"])
def test_pinned_memory_sizes(size: str) -> None:
    text = _cfg(f"a:\n  - devices: [0]\n    mps: {{replicas: 2, pinned-memory: {size}}}\n")
    share = parse_sharing(text, "s").configs["a"][0].share
    assert isinstance(share, MpsShare) and share.pinned_memory == size


MIG_PARTED = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2}
    - devices: [2]
      device-filter: "0x233510DE"
      mig-enabled: true
      mig-devices: {}
    - devices: [3]
      mig-enabled: false
"""


def test_mig_parted_file_is_read_as_mig_only() -> None:
    cfg = parse_sharing(MIG_PARTED, "mig.yaml")
    assert cfg.mig_parted is True
    assert [e.share for e in cfg.configs["all-disabled"]] == [Whole()]
    first, second, third = cfg.configs["custom"]
    assert isinstance(first.share, MigShare) and first.share.mig_config is None
    assert [(p.name, p.count) for p in first.share.profiles or ()] == [("1g.18gb", 2)]
    assert second.share == MigShare((), None) and second.device_filter == (DeviceId(0x233510DE),)
    assert third.share == Whole() and third.devices == (3,)
    assert str(first.mark) == "mig.yaml:7:7"


def test_mig_parted_errors_are_mig_parted_errors() -> None:
    with pytest.raises(ConfigError, match=r"m:4:7: .*missing 'mig-enabled'"):
        parse_sharing("version: v1\nmig-configs:\n  a:\n    - devices: all\n", "m")


def _cfg(body: str) -> str:
    return "version: nodeagent/v1\nsharing-configs:\n" + textwrap.indent(
        textwrap.dedent(body), "  "
    )


def _e(body: str) -> str:
    """One config 'a' with one entry whose lines are `body` (entry keys at column 7)."""
    return _cfg("a:\n  - " + textwrap.indent(body, "    ").lstrip())


# (case id, file text, words that must appear in the one error, "line:col" it must name)
BAD = [
    ("not-yaml", "version: nodeagent/v1\nsharing-configs: [\n", "not valid YAML", "3:1"),
    ("empty-file", "", "the file is empty", None),
    ("not-a-mapping", "- a\n", "the file must be a mapping", "1:1"),
    ("custom-tag", _e("devices: all\nwhole: !foo {}\n"), "tag '!foo' is not allowed", "5:14"),
    ("missing-version", "sharing-configs: {a: [{devices: all, whole: {}}]}\n", "missing 'version", "1:1"),
    ("wrong-version", "version: v2\nsharing-configs: {a: [{devices: all, whole: {}}]}\n", "version must be nodeagent/v1", "1:10"),
    ("unknown-top-key", "version: nodeagent/v1\nsharing: {}\n", "unknown key 'sharing'", "2:1"),
    ("missing-configs", "version: nodeagent/v1\n", "missing 'sharing-configs'", "1:1"),
    ("empty-configs", "version: nodeagent/v1\nsharing-configs: {}\n", "sharing-configs is empty", "2:18"),
    ("configs-list", "version: nodeagent/v1\nsharing-configs: []\n", "sharing-configs must be a mapping", "2:18"),
    ("config-not-list", _cfg("a:\n  devices: all\n"), "must be a list of entries", "4:5"),
    ("config-no-entries", _cfg("a: []\n"), "config 'a' has no entries", "3:6"),
    ("duplicate-config", _cfg("a: [{devices: all, whole: {}}]\na: [{devices: all, whole: {}}]\n"), "key 'a' twice", "4:3"),
    ("entry-not-mapping", _cfg("a:\n  - all\n"), "entry 1 must be a mapping", "4:7"),
    ("unknown-entry-key", _e("devices: all\nwhole: {}\nmig-enabled: true\n"), "unknown key 'mig-enabled'", "6:7"),
    ("missing-devices", _e("whole: {}\n"), "missing 'devices'", "4:7"),
    ("devices-bad-word", _e("devices: some\nwhole: {}\n"), "devices must be 'all' or a list", "4:16"),
    ("devices-float", _e("devices: 1.0\nwhole: {}\n"), "devices must be 'all' or a list of GPU indices, not float '1.0'", "4:16"),
    ("devices-negative", _e("devices: [-1]\nwhole: {}\n"), "integer >= 0", "4:17"),
    ("filter-bad", _e("devices: all\ndevice-filter: A100\nwhole: {}\n"), "PCI device id", "5:22"),
    ("no-strategy", _e("devices: all\n"), "entry 1: missing the sharing: give one of mig, mps", "4:7"),
    ("two-strategies", _e("devices: all\nwhole: {}\nmps: {replicas: 2}\n"), "has both 'whole' and 'mps'", "6:7"),
    ("mig-not-mapping", _e("devices: all\nmig: 1g.18gb\n"), "mig must be a mapping", "5:12"),
    ("mig-null", _e("devices: all\nmig:\n"), "mig must be a mapping, not empty", "5:11"),
    ("mig-neither", _e("devices: all\nmig: {}\n"), "exactly one of 'mig-devices'", "5:12"),
    ("mig-both", _e("devices: all\nmig: {mig-config: x, mig-devices: {}}\n"), "exactly one of 'mig-devices'", "5:12"),
    ("mig-unknown-key", _e("devices: all\nmig: {mig-devices: {}, mig-enabled: true}\n"), "unknown key 'mig-enabled'", "5:30"),
    ("mig-bad-profile", _e("devices: all\nmig: {mig-devices: {1g-18gb: 1}}\n"), "'1g-18gb' is not a MIG profile name", "5:27"),
    ("mig-bad-attribute", _e("devices: all\nmig: {mig-devices: {1g.18gb+me-x: 1}}\n"), "both '+' and '-'", "5:27"),
    ("mig-count-negative", _e("devices: all\nmig: {mig-devices: {1g.18gb: -1}}\n"), "count of 1g.18gb must be an integer >= 0", "5:36"),
    ("mig-devices-null", _e("devices: all\nmig: {mig-devices: }\n"), "write {} for no slices", "5:26"),
    ("mig-config-number", _e("devices: all\nmig: {mig-config: 3}\n"), "mig-config must be a config name, not int", "5:25"),
    ("mig-config-empty", _e("devices: all\nmig: {mig-config: ''}\n"), "mig-config must be a config name", "5:25"),
    ("mps-null", _e("devices: all\nmps:\n"), "mps must be a mapping", "5:11"),
    ("mps-no-replicas", _e("devices: all\nmps: {thread-percentage: 50}\n"), "missing 'replicas'", "5:12"),
    ("mps-one-replica", _e("devices: all\nmps: {replicas: 1}\n"), "replicas must be an integer 2-100, not int '1'", "5:23"),
    ("mps-replicas-str", _e("devices: all\nmps: {replicas: '4'}\n"), "replicas must be an integer 2-100, not str '4'", "5:23"),
    ("mps-101-replicas", _e("devices: all\nmps: {replicas: 101}\n"), "replicas must be an integer 2-100, not int '101'", "5:23"),
    ("mps-replicas-bool", _e("devices: all\nmps: {replicas: true}\n"), "not bool", "5:23"),
    ("mps-percentage-0", _e("devices: all\nmps: {replicas: 2, thread-percentage: 0}\n"), "thread-percentage must be an integer 1-100", "5:45"),
    ("mps-percentage-101", _e("devices: all\nmps: {replicas: 2, thread-percentage: 101}\n"), "1-100, not int '101'", "5:45"),
    ("mps-pinned-bad", _e("devices: all\nmps: {replicas: 2, pinned-memory: lots}\n"), "pinned-memory 'lots' is not a size", "5:41"),
    ("mps-pinned-zero", _e("devices: all\nmps: {replicas: 2, pinned-memory: 0G}\n"), "is not a size", "5:41"),
    ("mps-pinned-tiny", _e("devices: all\nmps: {replicas: 2, pinned-memory: 512K}\n"), "under 1 MiB", "5:41"),
    ("mps-pinned-list", _e("devices: all\nmps: {replicas: 2, pinned-memory: [2G]}\n"), "must be a size like 2G", "5:41"),
    ("mps-unknown-key", _e("devices: all\nmps: {replicas: 2, threads: 50}\n"), "unknown key 'threads'", "5:26"),
    ("ts-no-replicas", _e("devices: all\ntime-slicing: {}\n"), "time-slicing: missing 'replicas'", "5:21"),
    ("ts-one-replica", _e("devices: all\ntime-slicing: {replicas: 1}\n"), "replicas must be an integer 2-1024", "5:32"),
    ("ts-1025-replicas", _e("devices: all\ntime-slicing: {replicas: 1025}\n"), "replicas must be an integer 2-1024, not int '1025'", "5:32"),
    ("ts-70-digit-replicas", _e("devices: all\ntime-slicing: {replicas: " + "9" * 70 + "}\n"), "replicas must be an integer 2-1024", "5:32"),
    ("ts-unknown-key", _e("devices: all\ntime-slicing: {replicas: 2, thread-percentage: 5}\n"), "unknown key 'thread-percentage'", "5:35"),
    ("whole-with-key", _e("devices: all\nwhole: {replicas: 2}\n"), "whole: unknown key 'replicas'", "5:15"),
    ("whole-scalar", _e("devices: all\nwhole: yes\n"), "whole must be a mapping, not bool", "5:14"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "words", "where"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_file_gives_one_clear_error(text: str, words: str, where: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse_sharing(text, "s.yaml")
    message = str(info.value)
    assert "errors:" not in message, message  # exactly one error
    assert words in message, message
    assert message.startswith(f"s.yaml:{where}: " if where else "s.yaml: "), message


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    text = _cfg(
        "a:\n"
        "  - {devices: [0], mps: {replicas: 1}}\n"
        "  - {devices: [1], bogus: 1, whole: {}}\n"
        "b:\n"
        "  - {devices: [0]}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_sharing(text, "s.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "s.yaml has 3 errors:"
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        "s.yaml:4:38",
        "s.yaml:5:22",
        "s.yaml:7:7",
    ]


def test_error_count_is_capped() -> None:
    body = "a:\n" + "".join(f"  - {{devices: [{i}], mps: {{replicas: 1}}}}\n" for i in range(30))
    with pytest.raises(ConfigError) as info:
        parse_sharing(_cfg(body), "s")
    assert "has 30 errors" in str(info.value) and "... and 10 more" in str(info.value)


KEYS = [
    "version", "sharing-configs", "mig-configs", "devices", "device-filter", "mig", "mps",
    "time-slicing", "whole", "mig-devices", "mig-config", "replicas", "thread-percentage",
    "pinned-memory", "mig-enabled", "1g.18gb", "a",
]  # fmt: skip
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 200),
    st.floats(allow_nan=False),
    st.sampled_from(["all", "v1", "nodeagent/v1", "2G", "0x233510DE", "1g.18gb", "", "x"]),
    st.text(max_size=5),
)
TREES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=4),
    ),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES, wrap=st.sampled_from(["none", "configs", "entry"]))
def test_arbitrary_yaml_raises_only_config_error(tree: Any, wrap: str) -> None:
    if wrap == "configs":
        tree = {"version": "nodeagent/v1", "sharing-configs": tree}
    elif wrap == "entry":
        tree = {"version": "nodeagent/v1", "sharing-configs": {"a": [tree]}}
    try:
        cfg = parse_sharing(yaml.safe_dump(tree), "fuzz.yaml")
    except ConfigError as err:
        assert str(err).startswith("fuzz.yaml")
    else:
        for entries in cfg.configs.values():
            assert entries and all(isinstance(e, SharingEntry) for e in entries)
