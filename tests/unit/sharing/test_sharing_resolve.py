"""Resolving a sharing config on emulated nodes: intents, MIG desired states, and every conflict
refused with the GPU and the entry's position."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import ConfigError, NothingMatched
from nodeagent.mig.config import parse_config
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import Inventory
from nodeagent.sharing.config import MpsShare, parse_sharing
from nodeagent.sharing.resolve import GpuIntent, Resolution, resolve_sharing
from nodeagent.sim import SimulatedNvml, parse_spec


@functools.cache
def node(spec: str) -> Inventory:
    session = NvmlSession(SimulatedNvml(parse_spec(spec)))
    try:
        return read_inventory(session)
    finally:
        session.close()


def with_gpu(inventory: Inventory, index: int, **changes: Any) -> Inventory:
    gpus = list(inventory.gpus)
    gpus[index] = replace(gpus[index], **changes)
    return replace(inventory, gpus=tuple(gpus))


def counts(inventory: Inventory, gpu: int, named: dict[str, int]) -> dict[int, int]:
    profiles = inventory.gpus[gpu].profiles
    return {next(p.id for p in profiles if p.name == name): n for name, n in named.items()}


def sharing(*entries: str, name: str = "c") -> str:
    """A file with config `name` whose entries (flow mappings) sit on lines 4, 5, ... column 7."""
    lines = "".join(f"    - {e}\n" for e in entries)
    return f"version: nodeagent/v1\nsharing-configs:\n  {name}:\n{lines}"


def run(text: str, spec: str | Inventory = "h200x8", mig: str | None = None) -> Resolution:
    inventory = node(spec) if isinstance(spec, str) else spec
    mig_file = parse_config(mig, "mig.yaml") if mig is not None else None
    return resolve_sharing(parse_sharing(text, "s.yaml"), "c", inventory, mig_file)


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
"""


def test_the_mixed_example_on_eight_h200() -> None:
    inventory = node("h200x8")
    res = resolve_sharing(parse_sharing(MIXED, "s.yaml"), "mixed", inventory)
    assert [(i.gpu, i.strategy, i.replicas, i.source) for i in res.intents.values()] == [
        (0, "mig", 1, "s.yaml:4:7"),
        (1, "mig", 1, "s.yaml:4:7"),
        (2, "mps", 4, "s.yaml:7:7"),
        (3, "mps", 4, "s.yaml:7:7"),
        (4, "time-slicing", 4, "s.yaml:9:7"),
        (5, "whole", 1, "s.yaml:11:7"),
        (6, "whole", 1, "s.yaml:11:7"),
        (7, "whole", 1, "s.yaml:11:7"),
    ]
    sliced = counts(inventory, 0, {"1g.18gb": 4, "3g.71gb": 1})
    assert {g: (d.mig_enabled, d.counts) for g, d in res.mig.items()} == {
        0: (True, sliced),
        1: (True, sliced),
        **{g: (False, {}) for g in range(2, 8)},
    }
    assert res.mps == MpsShare(4, 25, None)
    assert res.mps_devices == (2, 3)
    assert res.pinned == {2: "32G", 3: "32G"}


def test_mig_enabled_gpu_under_mps_gets_mig_disabled() -> None:
    inventory = with_gpu(node("h200x8"), 2, mig_current=True)
    res = resolve_sharing(parse_sharing(MIXED, "s.yaml"), "mixed", inventory)
    assert res.mig[2].mig_enabled is False and res.intents[2].strategy == "mps"


def test_mixed_node_with_device_filters_per_model() -> None:
    text = sharing(
        '{devices: all, device-filter: "0x233510DE", mig: {mig-devices: {"3g.71gb": 2}}}',
        '{devices: all, device-filter: "0x20B010DE", mps: {replicas: 2, pinned-memory: 10G}}',
    )
    inventory = node("h200x4,a100-40gbx4")
    res = run(text, inventory)
    assert {g: i.strategy for g, i in res.intents.items()} == {
        **dict.fromkeys(range(4), "mig"),
        **dict.fromkeys(range(4, 8), "mps"),
    }
    assert res.mig[0].counts == counts(inventory, 0, {"3g.71gb": 2})
    assert res.mps_devices == (4, 5, 6, 7) and res.mps == MpsShare(2, None, None)
    assert res.pinned == dict.fromkeys(range(4, 8), "10G")


def test_uncovered_gpus_are_left_out() -> None:
    res = run(sharing("{devices: [1], time-slicing: {replicas: 3}}"), "a100-40gbx8")
    assert res.intents == {1: GpuIntent(1, "time-slicing", 3, "s.yaml:4:7")}
    assert list(res.mig) == [1] and res.mps is None and res.mps_devices == () and res.pinned == {}


def test_mps_entries_may_differ_in_pinned_memory_only() -> None:
    res = run(
        sharing(
            "{devices: [0], mps: {replicas: 3, pinned-memory: 2G}}",
            "{devices: [1, 2], mps: {replicas: 3}}",
            "{devices: [3], mps: {replicas: 3, pinned-memory: 4096M}}",
        )
    )
    assert res.mps == MpsShare(3, None, None) and res.mps_devices == (0, 1, 2, 3)
    assert res.pinned == {0: "2G", 3: "4096M"}


MIG_PARTED = """\
version: v1
mig-configs:
  c:
    - devices: [0, 1, 2, 3]
      mig-enabled: true
      mig-devices: {"1g.10gb": 4}
    - devices: [4, 5]
      mig-enabled: true
      mig-devices: {}
    - devices: [6]
      mig-enabled: false
"""


def test_mig_parted_file_resolves_as_mig_only() -> None:
    inventory = node("a100-40gbx8")
    res = run(MIG_PARTED, inventory)
    assert {g: i.strategy for g, i in res.intents.items()} == {
        **dict.fromkeys(range(6), "mig"),
        6: "whole",
    }
    assert all(i.replicas == 1 for i in res.intents.values())
    assert res.mig[0].counts == counts(inventory, 0, {"1g.10gb": 4})
    assert res.mig[4].mig_enabled is True and res.mig[4].counts == {}
    assert res.mig[6].mig_enabled is False and 7 not in res.mig
    assert res.mps is None and res.mps_devices == ()


MIG_FILE = """\
version: v1
mig-configs:
  all-balanced:
    - devices: all
      device-filter: "0x233510DE"
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    - devices: all
      device-filter: "0x20B010DE"
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  all-disabled:
    - devices: all
      mig-enabled: false
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 8}
"""


def test_mig_config_reference_takes_the_named_configs_slices() -> None:
    inventory = node("h200x4,a100-40gbx4")
    text = sharing(
        "{devices: [0, 1, 4], mig: {mig-config: all-balanced}}",
        "{devices: [2, 5], mps: {replicas: 2}}",
    )
    res = run(text, inventory, MIG_FILE)
    assert res.mig[0].counts == counts(inventory, 0, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1})
    assert res.mig[4].counts == counts(inventory, 4, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
    assert {res.mig[g].source for g in (0, 1, 4)} == {"s.yaml:4:7"}  # the sharing entry
    assert res.intents[4] == GpuIntent(4, "mig", 1, "s.yaml:4:7")
    assert res.mig[2].mig_enabled is False and res.mps_devices == (2, 5)


ONE_ERROR = [
    # (case id, file, node, MIG file, words, position the error names)
    ("unknown-config", sharing("{devices: all, whole: {}}", name="other"), "h200x8", None,
     "no config named 'c'; the file defines: other", "s.yaml: "),
    ("gpu-twice", sharing("{devices: [0, 1], whole: {}}", "{devices: [1], mps: {replicas: 2}}"),
     "h200x8", None, "GPU 1 is already configured by the entry at s.yaml:4:7", "s.yaml:5:7"),
    ("profile-missing", sharing('{devices: [0], mig: {mig-devices: {"1g.5gb": 1}}}'), "h200x8",
     None, "has no MIG profile 1g.5gb", "s.yaml:4:42"),
    ("profile-missing-on-a100", sharing('{devices: all, mig: {mig-devices: {"1g.18gb": 1}}}'),
     "h200x4,a100-40gbx4", None, "GPUs 4, 5, 6, 7 (NVIDIA A100-SXM4-40GB) have no MIG profile",
     "s.yaml:4:42"),
    ("over-capacity", sharing('{devices: [0], mig: {mig-devices: {"1g.18gb": 8}}}'), "h200x8",
     None, "holds at most 7x1g.18gb; asked for 8", "s.yaml:4:42"),
    ("no-placement", sharing('{devices: [0], mig: {mig-devices: {"4g.71gb": 1, "3g.71gb": 2}}}'),
     "h200x8", None, "do not fit together on GPU 0", "s.yaml:4:7"),
    ("mps-replicas-differ",
     sharing("{devices: [0], mps: {replicas: 2}}", "{devices: [1], mps: {replicas: 4}}"), "h200x8",
     None, "GPU 1: MPS replicas 4 differs from 2 at s.yaml:4:7; one MPS daemon serves all MPS"
     " GPUs and its replicas is daemon-wide", "s.yaml:5:7"),
    ("mps-percentage-differs",
     sharing("{devices: [0], mps: {replicas: 2, thread-percentage: 50}}",
             "{devices: [1], mps: {replicas: 2}}"), "h200x8", None,
     "GPU 1: MPS thread-percentage unset differs from 50", "s.yaml:5:7"),
    ("pinned-over-memory", sharing("{devices: [3], mps: {replicas: 2, pinned-memory: 200G}}"),
     "h200x8", None, "GPU 3 (NVIDIA H200): pinned-memory 200G is more than the 143771 MiB",
     "s.yaml:4:7"),
    ("pinned-over-a100", sharing("{devices: all, mps: {replicas: 2, pinned-memory: 41G}}"),
     "h200x4,a100-40gbx4", None, "GPUs 4, 5, 6, 7 (NVIDIA A100-SXM4-40GB): pinned-memory 41G is more than the 40960 MiB",
     "s.yaml:4:7"),
    ("mig-config-no-file", sharing("{devices: [0], mig: {mig-config: all-balanced}}"), "h200x8",
     None, "mig-config 'all-balanced' needs a MIG config file", "s.yaml:4:7"),
    ("mig-config-unknown", sharing("{devices: [0], mig: {mig-config: balanced}}"), "h200x8",
     MIG_FILE, "mig-config 'balanced' is not in mig.yaml; it defines: all-balanced,"
     " all-disabled, first-two, too-many", "s.yaml:4:7"),
    ("mig-config-disables", sharing("{devices: [0], mig: {mig-config: all-disabled}}"), "h200x8",
     MIG_FILE, "GPU 0: mig-config 'all-disabled' (mig.yaml:13:7) leaves MIG disabled",
     "s.yaml:4:7"),
    ("mig-config-misses-gpu", sharing("{devices: [2], mig: {mig-config: first-two}}"), "h200x8",
     MIG_FILE, "GPU 2: mig-config 'first-two' (mig.yaml) does not cover it", "s.yaml:4:7"),
    ("mig-config-bad-on-node", sharing("{devices: [0], mig: {mig-config: too-many}}"), "h200x8",
     MIG_FILE, "mig-config 'too-many' does not fit this node", "s.yaml:4:7"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "spec", "mig", "words", "where"),
    [c[1:] for c in ONE_ERROR],
    ids=[c[0] for c in ONE_ERROR],
)
def test_conflict_is_refused_naming_gpu_and_entry(
    text: str, spec: str, mig: str | None, words: str, where: str
) -> None:
    with pytest.raises(ConfigError) as info:
        run(text, spec, mig)
    message = str(info.value)
    assert words in message, message
    assert message.startswith(where), message


def test_mig_on_a_gpu_without_mig_is_refused() -> None:
    inventory = with_gpu(node("h200x8"), 5, mig_capable=False)
    with pytest.raises(ConfigError, match=r"^s.yaml:4:7: GPU 5 \(NVIDIA H200\) does not support"):
        run(sharing("{devices: [5], mig: {mig-devices: {}}}"), inventory)
    # the same GPU is fine whole, under MPS or time-sliced
    res = run(sharing("{devices: [5], time-slicing: {replicas: 2}}"), inventory)
    assert res.mig[5].mig_enabled is False


def test_all_conflicts_of_a_config_are_reported_at_once() -> None:
    text = sharing(
        "{devices: [0], mps: {replicas: 2, pinned-memory: 1T}}",
        "{devices: [1], mps: {replicas: 3}}",
        "{devices: [2], mps: {replicas: 2, thread-percentage: 10}}",
    )
    with pytest.raises(ConfigError) as info:
        run(text)
    lines = str(info.value).splitlines()
    assert lines[0] == "s.yaml has 3 errors:"
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        "s.yaml:4:7",
        "s.yaml:5:7",
        "s.yaml:6:7",
    ]


def test_config_covering_no_gpu_is_nothing_matched() -> None:
    with pytest.raises(NothingMatched, match="matches no GPU"):
        run(sharing('{devices: all, device-filter: "0x20B010DE", whole: {}}'), "h200x8")


ENTRIES = st.sampled_from(
    [
        "{devices: all, whole: {}}",
        "{devices: [0, 1], whole: null}",
        "{devices: [2], mps: {replicas: 2}}",
        "{devices: [3], mps: {replicas: 4, thread-percentage: 25, pinned-memory: 32G}}",
        "{devices: [4, 9], time-slicing: {replicas: 4}}",
        '{devices: [5], mig: {mig-devices: {"1g.18gb": 7}}}',
        '{devices: all, device-filter: "0x20B010DE", mig: {mig-devices: {"1g.5gb": 2}}}',
        "{devices: [6], mig: {mig-config: all-balanced}}",
        "{devices: [7], mig: {mig-config: nope}}",
        '{devices: [1], mig: {mig-devices: {"7g.141gb": 1, "1g.18gb": 1}}}',
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.lists(ENTRIES, min_size=1, max_size=4),
    spec=st.sampled_from(["h200x8", "a100-40gbx8", "h200x4,a100-40gbx4"]),
    with_mig_file=st.booleans(),
)
def test_resolution_raises_only_config_errors(
    entries: list[str], spec: str, with_mig_file: bool
) -> None:
    try:
        res = run(sharing(*entries), spec, MIG_FILE if with_mig_file else None)
    except (ConfigError, NothingMatched):
        return
    assert set(res.intents) == set(res.mig)
    for gpu, intent in res.intents.items():
        assert res.mig[gpu].mig_enabled == (intent.strategy == "mig")
        assert (gpu in res.mps_devices) == (intent.strategy == "mps")


def test_a_skipped_gpu_is_a_sharing_event_not_a_mig_one() -> None:
    from tests.support.cli import captured_logs

    text = sharing("{devices: [0, 7], mps: {replicas: 2}}")
    with captured_logs("info") as logs:
        res = run(text, "h200x2")
    assert set(res.intents) == {0}
    events = [e["event"] for e in logs]
    assert "mig.config.skipped" not in events
    (skipped,) = [e for e in logs if e["event"] == "sharing.config.skipped"]
    assert skipped["config"] == "c" and "7" in skipped["reason"]
