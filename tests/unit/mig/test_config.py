"""The v1 config format: what parses, and a corpus of bad files each with one clear error."""

from __future__ import annotations

import textwrap

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import DeviceId, dump_config, parse_config

GOOD = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  custom:
    - devices: [0, 1]
      device-filter: ["0x233510DE", "0x20B010de"]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 2
        "3g.71gb": 1
        "1g.18gb+me": 0
    - devices: [2]
      device-filter: "0x233010DE"
      mig-enabled: true
      mig-devices: {}
    - devices: [3]
      mig-enabled: true
      mig-devices: {}
"""


def test_good_file_parses() -> None:
    cfg = parse_config(GOOD, "good.yaml")
    assert list(cfg.configs) == ["all-disabled", "custom"]
    (off,) = cfg.configs["all-disabled"]
    assert off.devices == "all" and off.mig_enabled is False and off.device_filter is None
    first, second, third = cfg.configs["custom"]
    assert first.devices == (0, 1)
    assert first.device_filter == (DeviceId(0x233510DE), DeviceId(0x20B010DE))
    assert [(p.name, p.count) for p in first.mig_devices] == [
        ("1g.18gb", 2),
        ("3g.71gb", 1),
        ("1g.18gb+me", 0),
    ]
    assert str(first.mig_devices[1].mark) == "good.yaml:12:9"
    assert second.device_filter == (DeviceId(0x233010DE),) and second.mig_devices == ()
    assert third.mig_devices == ()
    assert str(cfg.marks["custom"]) == "good.yaml:6:3"


def test_dump_round_trips() -> None:
    text = dump_config(
        {"x": [{"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 1}}]}
    )
    cfg = parse_config(text, "dumped")
    assert cfg.configs["x"][0].mig_devices[0].count == 1


def _cfg(body: str) -> str:
    return "version: v1\nmig-configs:\n" + textwrap.indent(textwrap.dedent(body), "  ")


# (case id, file text, words that must appear in the one error, "line:col" it must name)
BAD = [
    ("not-yaml", "version: v1\nmig-configs: [\n", "not valid YAML", "3:1"),
    ("empty-file", "", "empty", None),
    ("not-a-mapping", "- a\n- b\n", "must be a mapping", "1:1"),
    (
        "missing-version",
        "mig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n",
        "missing 'version",
        "1:1",
    ),
    (
        "wrong-version",
        "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\n",
        "version must be v1",
        "1:10",
    ),
    ("unknown-top-key", "version: v1\nmig-config: {}\n", "unknown key 'mig-config'", "2:1"),
    ("missing-mig-configs", "version: v1\n", "missing 'mig-configs'", "1:1"),
    ("empty-mig-configs", "version: v1\nmig-configs: {}\n", "mig-configs is empty", "2:14"),
    ("config-not-list", _cfg("a:\n  devices: all\n"), "must be a list of entries", "4:5"),
    ("config-no-entries", _cfg("a: []\n"), "has no entries", "3:6"),
    ("entry-not-mapping", _cfg("a:\n  - all\n"), "must be a mapping", "4:7"),
    (
        "unknown-entry-key",
        _cfg("a:\n  - devices: all\n    mig-enabled: false\n    mig-device: {}\n"),
        "unknown key 'mig-device'",
        "6:7",
    ),
    ("missing-devices", _cfg("a:\n  - mig-enabled: false\n"), "missing 'devices'", "4:7"),
    (
        "devices-bad-word",
        _cfg("a:\n  - devices: some\n    mig-enabled: false\n"),
        "devices must be 'all' or a list",
        "4:16",
    ),
    # mig-parted refuses a number where the list goes (not the string "all", not a []int)
    (
        "devices-float",
        _cfg("a:\n  - devices: 1.0\n    mig-enabled: false\n"),
        "not float '1.0'",
        "4:16",
    ),
    ("devices-int", _cfg("a:\n  - devices: 1\n    mig-enabled: false\n"), "not int '1'", "4:16"),
    (
        "devices-negative",
        _cfg("a:\n  - devices: [-1]\n    mig-enabled: false\n"),
        "integer >= 0",
        "4:17",
    ),
    (
        "devices-string",
        _cfg("a:\n  - devices: ['0']\n    mig-enabled: false\n"),
        "integer >= 0, not str '0'",
        "4:17",
    ),
    ("missing-mig-enabled", _cfg("a:\n  - devices: all\n"), "missing 'mig-enabled'", "4:7"),
    (
        "mig-enabled-string",
        _cfg("a:\n  - devices: all\n    mig-enabled: 'true'\n"),
        "mig-enabled must be true or false",
        "5:20",
    ),
    (
        "disabled-with-devices",
        _cfg("a:\n  - devices: all\n    mig-enabled: false\n    mig-devices: {1g.18gb: 1}\n"),
        "must be empty when mig-enabled is false",
        "6:20",
    ),
    (
        "mig-devices-null",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n"),
        "write {} for no slices",
        "6:19",
    ),
    (
        "mig-devices-list",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: [1g.18gb]\n"),
        "must be a mapping",
        "6:20",
    ),
    (
        "bad-profile-name",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g-18gb: 1}\n"),
        "'1g-18gb' is not a MIG profile name",
        "6:21",
    ),
    (
        "ci-profile-attributes-both",
        _cfg(
            "a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1c.3g.71gb+me-x: 2}\n"
        ),
        "both '+' and '-' attributes",
        "6:21",
    ),
    (
        "count-negative",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: -2}\n"),
        "count of 1g.18gb must be an integer >= 0",
        "6:30",
    ),
    (
        "count-float",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 1.5}\n"),
        "float",
        "6:30",
    ),
    (
        "count-bool",
        _cfg("a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: true}\n"),
        "bool",
        "6:30",
    ),
    (
        "duplicate-profile",
        _cfg(
            "a:\n  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.18gb: 1, 1g.18gb: 2}\n"
        ),
        "key '1g.18gb' twice",
        "6:33",
    ),
    (
        "duplicate-config",
        _cfg(
            "a:\n  - {devices: all, mig-enabled: false}\na:\n  - {devices: all, mig-enabled: true}\n"
        ),
        "key 'a' twice",
        "5:3",
    ),
    (
        "filter-bad",
        _cfg("a:\n  - devices: all\n    device-filter: A100\n    mig-enabled: false\n"),
        "PCI device id like '0x233510DE'",
        "5:22",
    ),
    (
        "filter-empty",
        _cfg("a:\n  - devices: all\n    device-filter: []\n    mig-enabled: false\n"),
        "device-filter is an empty list",
        "5:22",
    ),
]


@pytest.mark.parametrize(("text", "words", "where"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config_gives_one_clear_error(text: str, words: str, where: str | None) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "bad.yaml")
    message = str(err.value)
    assert "\n" not in message, message
    assert words in message
    assert message.startswith("bad.yaml")
    if where:
        assert message.startswith(f"bad.yaml:{where}:"), message


def test_all_errors_are_reported_at_once() -> None:
    text = _cfg(
        """\
        a:
          - devices: [0, 0]
            mig-enabled: maybe
            extra: 1
        b:
          - devices: all
            mig-enabled: true
            mig-devices: {1g.18gb+: 1}
        """
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text, "many.yaml")
    lines = str(err.value).splitlines()
    assert lines[0] == "many.yaml has 3 errors:"  # devices [0, 0]: one GPU, as in mig-parted
    assert [line.split(":")[1] for line in lines[1:]] == ["5", "6", "10"]
