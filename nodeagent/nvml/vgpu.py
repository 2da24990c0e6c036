"""vGPU guests: the vGPU manager's driver on the hypervisor host, from the GPUs' PCI config
space, where GPU Feature Discovery reads it (k8s-device-plugin internal/vgpu: NVML in a guest
does not say it).

A vGPU's PCI config space carries a vendor-specific capability (id 0x09) signed "VF"; after
its header, records of (id, length, data) lead to record 0, which holds the host driver's
version and branch, 10 bytes each, NUL-padded. Reading the whole config space (256 bytes)
needs root: with less, nothing is said of vGPUs (GFD likewise publishes no vgpu label then).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import read_regular
from nodeagent.nvml.inventory import VgpuDevice
from nodeagent.nvml.session import NvmlSession

CONFIG_SPACE_BYTES = 256  # the standard header and capabilities; GFD needs all of it
_STATUS, _STATUS_CAPABILITIES = 0x06, 0x10
_CAPABILITIES_POINTER = 0x34
_VENDOR_SPECIFIC = 0x09
_RECORDS_START = 5  # the first record's offset inside the capability
_TEXT_BYTES = 10  # the host driver's version, then its branch


def vendor_capability(config: bytes) -> bytes | None:
    """The first vendor-specific capability of a full config space, or None (no capability
    list, none found, a looping or broken list)."""
    if not config[_STATUS] & _STATUS_CAPABILITIES:
        return None
    seen: set[int] = set()
    pos = config[_CAPABILITIES_POINTER]
    while pos and pos not in seen and pos + 2 < len(config):
        seen.add(pos)
        cap_id, following, length = config[pos], config[pos + 1], config[pos + 2]
        if cap_id == 0xFF:
            return None
        if cap_id == _VENDOR_SPECIFIC:
            return config[pos : pos + length]
        pos = following
    return None


def _text(data: bytes) -> str:
    return data.strip(b"\x00").decode("ascii", "replace")


def host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) from the vGPU capability's host-driver record, or None without one."""
    pos = _RECORDS_START
    while pos < len(capability) and capability[pos] != 0:
        step = capability[pos + 1] if pos + 1 < len(capability) else 0
        if step == 0:
            return None  # a record of length 0 would never end
        pos += step
    end = pos + 2 + 2 * _TEXT_BYTES
    if pos >= len(capability) or end > len(capability):
        return None
    version = capability[pos + 2 : pos + 2 + _TEXT_BYTES]
    return _text(version), _text(capability[pos + 2 + _TEXT_BYTES : end])


def parse_config_space(bus_id: str, config: bytes) -> VgpuDevice | None:
    """The vGPU at `bus_id`, or None when its config space says it is no vGPU."""
    capability = vendor_capability(config)
    if capability is None or capability[3:5] != b"VF":
        return None
    driver = host_driver(capability)
    return VgpuDevice(bus_id, *(driver if driver is not None else (None, None)))


def _config_space(session: NvmlSession, device: Path, bus_id: str) -> bytes | None:
    read = getattr(session.lib, "pci_config_space", None)  # the emulator stands in for sysfs
    if read is not None:
        found: bytes | None = read(bus_id)
        return found
    try:
        # sysfs gives a config space of 256 bytes to users, 4 KiB to root: read what is there
        config = read_regular(device / "config", "PCI config space", 1 << 16)
    except ConfigError:
        return None
    return None if config is None else config[:CONFIG_SPACE_BYTES]


def read_vgpus(
    session: NvmlSession, bus_ids: tuple[str, ...], folder: Callable[[str], Path]
) -> tuple[VgpuDevice, ...] | None:
    """The vGPUs among the GPUs at `bus_ids` (NVML's form; `folder` gives each one's sysfs
    folder), or None when a GPU's config space cannot be read in full (not root). Read once
    per session and set of GPUs: a config space's vGPU record is the host's, fixed while the
    guest runs (an inventory read after the first costs one dict lookup)."""
    kept: dict[tuple[str, ...], tuple[VgpuDevice, ...] | None]
    kept = session.static.setdefault("vgpu", {})
    if bus_ids not in kept:
        found: list[VgpuDevice] = []
        for bus_id in bus_ids:
            config = _config_space(session, folder(bus_id), bus_id)
            if config is None or len(config) < CONFIG_SPACE_BYTES:
                kept[bus_ids] = None
                return None
            vgpu = parse_config_space(bus_id, config)
            if vgpu is not None:
                found.append(vgpu)
        kept[bus_ids] = tuple(found)
    return kept[bus_ids]
