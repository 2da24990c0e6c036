"""The real-GPU comparison (tests/gpu/dra/test_real_dra.py) finds the emulator's model of every
card the emulator models, by the name NVML gives the card: it once knew the H200 alone and
skipped a lent H100 80GB HBM3 that the emulator models."""

from __future__ import annotations

import pytest

from nodeagent.sim.models import MODEL_NAMES, load_model
from tests.gpu.dra.test_real_dra import emulator_model


@pytest.mark.parametrize("key", MODEL_NAMES)
def test_every_emulated_card_is_found_by_its_nvml_name(key: str) -> None:
    assert emulator_model(load_model(key).name) == key


def test_the_lent_h100_and_a_card_the_emulator_lacks() -> None:
    assert emulator_model("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert emulator_model("NVIDIA H200") == "h200"
    assert emulator_model("NVIDIA L4") is None
