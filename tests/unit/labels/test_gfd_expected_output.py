"""Emulated nodes against GFD's own expected outputs (NVIDIA/k8s-device-plugin
tests/expected-output-mig-{none,single,mixed}.txt, copied under tests/fixtures/upstream/).

Each file is a list of `key=regex` lines. GFD's test (cmd/gpu-feature-discovery/main_test.go,
checkResult) accepts an output line that some regex matches anywhere in it; that is how the value
regexes are written (`gpu.product=[A-Za-z_-]+` accepts `NVIDIA-H200` by its start), so values are
checked the same way. This test is stricter on keys: each `nvidia.com/` key must match a line's
key regex whole, and every line of the file must be matched by some label. Exceptions, each for
a reason:
- `gfd.timestamp`: nodeagent publishes no timestamp (it would change the Node at every
  reconcile);
- MIG profile names with attributes (`1g.18gb.me`) or a compute-instance part (`1c.3g.71gb`):
  the files predate them and their key regex `mig-[0-9]+g\\.[0-9]+gb\\.` cannot match; GFD itself
  names such devices that way (go-nvlib's profile String(), `+` written `.`), so for those keys
  alone the profile part of the regex is widened;
- the labels of GFD's other labelers, published only on some nodes, are checked against their
  own lines, none of them required: `vgpu.*` against tests/expected-output-vgpu.txt, and
  `gpu.clique` (the emulated GB200 is fabric-attached) against the form in GFD's README
  (docs/gpu-feature-discovery/README.md: "GPUFabric ClusterUUID + CliqueID",
  `7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1`), which has no expected-output file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.labels.gfd import GfdOptions
from nodeagent.labels.render import render_labels
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.models import MODEL_NAMES
from tests.support.mig_apply import reconfigure

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures/upstream/k8s-device-plugin/tests"
PREFIX = "nvidia.com/"
NOT_PUBLISHED = {r"nvidia\.com\/gfd\.timestamp"}
_PLAIN_PROFILE = r"mig-[0-9]+g\.[0-9]+gb"
_ANY_PROFILE = r"mig-(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:\.me\.all|\.me|\.gfx|-me)?"
_NAMED_PROFILE = re.compile(r"mig-(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?P<attr>[.-][a-z.]+)?\.")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
SPECS = (*MODEL_NAMES, "a100-40gb,h100-80gb")


@dataclass(frozen=True)
class Expected:
    text: str  # the file's line
    key: re.Pattern[str]
    line: re.Pattern[str]


CLIQUE = r"nvidia\.com\/gpu\.clique=[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.[0-9]+$"


def _optional_lines() -> list[str]:
    return [*(UPSTREAM / "expected-output-vgpu.txt").read_text().splitlines(), CLIQUE]


def expected(strategy: str, optional: bool = True) -> list[Expected]:
    lines = (UPSTREAM / f"expected-output-mig-{strategy}.txt").read_text().splitlines()
    out = []
    for text in lines + (_optional_lines() if optional else []):
        key, _, _ = text.partition("=")
        out.append(Expected(text, re.compile(key), re.compile(text)))
    return out


def _widened(e: Expected) -> Expected:
    key = e.key.pattern.replace(_PLAIN_PROFILE, _ANY_PROFILE)
    return Expected(
        e.text, re.compile(key), re.compile(e.line.pattern.replace(_PLAIN_PROFILE, _ANY_PROFILE))
    )


def _match(key: str, value: str, lines: list[Expected]) -> Expected | None:
    candidates = lines
    named = _NAMED_PROFILE.match(key.removeprefix(PREFIX))
    if named and (named.group("attr") or "c." in named.group(0).split("g.")[0]):
        candidates = [_widened(e) for e in lines]
    for e in candidates:
        if e.key.fullmatch(key) and e.line.search(f"{key}={value}"):
            return e
    return None


def check(labels: dict[str, str], strategy: str, every_line: bool = True) -> None:
    """Every GFD key matches a line of the file; with `every_line`, every line is matched."""
    lines = expected(strategy)
    matched: set[str] = set()
    for key, value in labels.items():
        assert _LABEL_VALUE.fullmatch(value), f"{key}={value!r} is no valid label value"
        if not key.startswith(PREFIX):
            continue
        e = _match(key, value, lines)
        assert e is not None, f"{key}={value} matches no line of expected-output-mig-{strategy}"
        matched.add(e.text)
    if every_line:
        required = expected(strategy, optional=False)
        wanted = {e.text for e in required if e.key.pattern not in NOT_PUBLISHED}
        assert wanted - matched == set(), f"lines no label matched ({strategy})"


def node(spec: str, config: str | None, strategy: str) -> dict[str, str]:
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    inventory = read_inventory(session)
    if config is not None:
        configs = generate_configs(inventory)
        if config == "smallest":  # every GPU holds only the smallest profile all GPUs have
            common = set.intersection(*({p.name for p in g.profiles} for g in inventory.gpus))
            first = inventory.gpus[0].profiles
            smallest = min(
                (p for p in first if p.name in common),
                key=lambda p: (p.slice_count, p.memory_bytes),
            )
            config = "all-" + smallest.name.replace("+", ".")
        reconfigure(session, parse_config(dump_config(configs), "generated"), config, lib.reset)
        inventory = read_inventory(session)
    return render_labels(inventory, gfd=GfdOptions(strategy, "product-name\n"))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("config", [None, "all-balanced"])
def test_none(spec: str, config: str | None) -> None:
    labels = node(spec, config, "none")
    check(labels, "none")
    assert f"{PREFIX}mig.strategy" not in labels


@pytest.mark.parametrize("spec", SPECS)
def test_single(spec: str) -> None:
    labels = node(spec, "smallest", "single")
    check(labels, "single")
    assert "-MIG-" in labels[f"{PREFIX}gpu.product"]


@pytest.mark.parametrize("spec", SPECS)
def test_single_without_mig_is_a_subset(spec: str) -> None:
    """GFD's own test checks this case against the same file, line by line only."""
    check(node(spec, None, "single"), "single", every_line=False)


@pytest.mark.parametrize("spec", SPECS)
def test_mixed(spec: str) -> None:
    labels = node(spec, "all-balanced", "mixed")
    check(labels, "mixed")


@pytest.mark.parametrize("spec", SPECS)
def test_mixed_without_mig_is_a_subset(spec: str) -> None:
    check(node(spec, None, "mixed"), "mixed", every_line=False)


def test_mixed_attribute_profiles_need_only_the_documented_widening() -> None:
    labels = node("h200x2", "all-1g.18gb.me", "mixed")
    check(labels, "mixed")
    plain = expected("mixed")
    odd = [
        k
        for k in labels
        if k.startswith(f"{PREFIX}mig-") and not any(e.key.fullmatch(k) for e in plain)
    ]
    assert odd and all(k.startswith(f"{PREFIX}mig-1g.18gb.me.") for k in odd)


def test_single_invalid_fails_gfds_own_regex_on_sharing_strategy_only() -> None:
    """GFD writes `gpu.sharing-strategy=` (empty) for MIG-INVALID, which its own file's
    `=[none|mps|time-slicing]` cannot match: GFD's tests never reach that case. nodeagent
    writes what GFD writes, so that one line is the exception."""
    labels = node("h200", "all-balanced", "single")
    assert labels[f"{PREFIX}gpu.product"] == "NVIDIA-H200-MIG-INVALID"
    with pytest.raises(AssertionError, match=r"gpu\.sharing-strategy= matches no line"):
        check(labels, "single", every_line=False)
    del labels[f"{PREFIX}gpu.sharing-strategy"]
    check(labels, "single", every_line=False)


def test_the_check_catches_a_key_gfd_does_not_publish() -> None:
    labels = node("h200", None, "none") | {f"{PREFIX}gpu.colour": "green"}
    with pytest.raises(AssertionError, match=r"gpu\.colour=green matches no line"):
        check(labels, "none")


def test_the_check_catches_a_missing_line() -> None:
    labels = node("h200", None, "none")
    del labels[f"{PREFIX}gpu.mode"]
    with pytest.raises(AssertionError, match="lines no label matched"):
        check(labels, "none")


def test_the_check_catches_a_value_gfd_would_not_write() -> None:
    labels = node("h200", None, "none") | {f"{PREFIX}gpu.count": "two"}
    with pytest.raises(AssertionError, match=r"gpu\.count=two matches no line"):
        check(labels, "none")
