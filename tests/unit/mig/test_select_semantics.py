"""mig-parted's node semantics in config selection (pure, on GPUs read from the emulator)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import parse_config
from nodeagent.mig.select import resolve
from nodeagent.nvml import Inventory
from tests.support.mig import blank_gpu

CFG = parse_config(
    """\
version: v1
mig-configs:
  all-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
  gpu1-3g:
    - devices: [1]
      mig-enabled: true
      mig-devices: {"3g.71gb": 2}
  ci:
    - devices: all
      mig-enabled: true
      mig-devices: {"1c.3g.71gb": 4, "3g.71gb": 1}
""",
    "m.yaml",
)


def _node(mig_capable_second: bool) -> Inventory:
    first = replace(blank_gpu("h200"), index=0)
    second = replace(blank_gpu("h200"), index=1, mig_capable=mig_capable_second)
    return Inventory("580.159.04", 13000, (first, second))


def test_devices_all_skips_a_gpu_without_mig() -> None:
    notes: list[str] = []
    desired = resolve(CFG, "all-3g", _node(False), notes)
    assert set(desired) == {0}
    assert notes == [
        "m.yaml:4:7: GPU 1 (NVIDIA H200) does not support MIG; 'devices: all' skips it"
    ]


def test_an_explicit_index_without_mig_is_an_error() -> None:
    with pytest.raises(ConfigError, match="GPU 1 \\(NVIDIA H200\\) does not support MIG"):
        resolve(CFG, "gpu1-3g", _node(False))


def test_compute_instances_are_packed_into_gis() -> None:
    # One full 3g GI and four 1c CIs packed 3 + 1 into two more: three 3g GIs, and an H200
    # holds two. Refused before anything changes, naming the profile and the count.
    with pytest.raises(ConfigError, match=r"hold at most 2 GPU instances of 3g\.71gb; .* need 3"):
        resolve(CFG, "ci", _node(True))
    fits = parse_config(
        "version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"1c.3g.71gb": 4, "2c.3g.71gb": 1, "1g.18gb": 0}\n',
        "c.yaml",
    )
    desired = resolve(fits, "c", _node(True))[0]
    assert desired.counts == {9: 2}
    assert desired.shapes[9] == ((2, 1), (1, 1, 1))
