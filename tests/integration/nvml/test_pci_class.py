"""The reads GFD's labels need, over the emulator: the PCI class (NVML, else sysfs as GFD reads
it), the driver version, and each MIG device's attributes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from nodeagent.base.errors import NvmlError
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.read import sysfs_bus_id
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.faults import Fault, FaultPlan
from nodeagent.sim.models import MODEL_NAMES, load_model


@pytest.mark.parametrize("key", MODEL_NAMES)
def test_every_model_answers_a_3d_controller_and_its_driver(
    make_session: Callable[..., NvmlSession], key: str
) -> None:
    inv = read_inventory(make_session(key))
    assert [g.pci_class for g in inv.gpus] == [0x030200]
    assert inv.driver_version == load_model(key).driver_version


def _sysfs(root: Path, bus_id: str, vendor: str, pci_class: str) -> Path:
    device = root / "bus" / "pci" / "devices" / bus_id
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(pci_class + "\n")
    return root


@pytest.mark.parametrize(
    ("error", "vendor", "pci_class", "want"),
    [
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "0x10de", "0x030000", 0x030000),  # an older driver
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "0x10de", "0x030200", 0x030200),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "0x8086", "0x030000", None),  # not NVIDIA's device
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "0x10de", "garbage", None),
    ],
)
def test_without_nvml_the_class_comes_from_sysfs(
    tmp_path: Path, error: int, vendor: str, pci_class: str, want: int | None
) -> None:
    fault = Fault(function="nvmlDeviceGetPciInfoExt", error=error)
    lib = SimulatedNvml(parse_spec("h200"), faults=FaultPlan([fault], in_process=True))
    sysfs = _sysfs(tmp_path, "0000:18:00.0", vendor, pci_class)
    session = NvmlSession(lib)
    (gpu,) = read_inventory(session, sysfs=sysfs).gpus
    assert gpu.pci_class == want
    assert session.error_counts()["nvmlDeviceGetPciInfoExt"] == 0  # an answer, not a failure


def test_no_class_anywhere_is_none(tmp_path: Path) -> None:
    fault = Fault(function="nvmlDeviceGetPciInfoExt", error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    lib = SimulatedNvml(parse_spec("h200"), faults=FaultPlan([fault], in_process=True))
    (gpu,) = read_inventory(NvmlSession(lib), sysfs=tmp_path).gpus
    assert gpu.pci_class is None


def test_another_nvml_error_is_not_hidden() -> None:
    fault = Fault(function="nvmlDeviceGetPciInfoExt", error=pynvml.NVML_ERROR_GPU_IS_LOST)
    lib = SimulatedNvml(parse_spec("h200"), faults=FaultPlan([fault], in_process=True))
    with pytest.raises(NvmlError) as err:
        read_inventory(NvmlSession(lib))
    assert err.value.code == pynvml.NVML_ERROR_GPU_IS_LOST


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:2A:00.0", "0000:2a:00.0"),
        ("0001:3B:00.0", "0001:3b:00.0"),
        ("00010000:3B:00.0", "00010000:3b:00.0"),
    ],
)
def test_bus_id_as_sysfs_names_it(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


def test_mig_devices_carry_their_nvml_attributes(make_session: Callable[..., NvmlSession]) -> None:
    from nodeagent.mig.config import dump_config, parse_config
    from nodeagent.mig.generate import generate_configs
    from tests.support.mig_apply import reconfigure

    session = make_session("h200")
    cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "g")
    reconfigure(session, cfg, "all-balanced", session.lib.reset)
    (gpu,) = read_inventory(session).gpus
    by_profile = {s.profile: s.attributes for s in gpu.slices}
    three = by_profile["3g.71gb"]
    assert three is not None
    assert (three.memory_mib, three.multiprocessor_count) == (71424, 60)
    assert (three.gi_slice_count, three.ci_slice_count) == (3, 3)
    assert (three.engines.copy, three.engines.decoder, three.engines.jpeg) == (3, 3, 3)
