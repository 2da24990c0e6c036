"""GFD's options from nodeagent's settings; the one read of the host they need."""

from __future__ import annotations

from pathlib import Path

from nodeagent.errors import ConfigError
from nodeagent.files import read_regular
from nodeagent.labels.gfd import GfdOptions
from nodeagent.logs import get_logger
from nodeagent.settings import Labels

log = get_logger("nodeagent.labels")
MAX_MACHINE_TYPE_BYTES = 4096


def read_machine_type(path: Path) -> str | None:
    """The machine-type file's content (GFD's --machine-type-file; the DMI product name by
    default; its first 4 KiB, a label value holds 63 characters), or None where it cannot be
    read: gpu.machine is then `unknown`, as in GFD. A FIFO or a device there is never read
    (a publish would block on it, or read /dev/zero forever)."""
    try:
        data = read_regular(path, "the machine-type file", MAX_MACHINE_TYPE_BYTES)
    except ConfigError as err:
        log.warning("labels.machine_type.refused", error=str(err))
        return None
    except OSError as err:
        # Debug, not a warning: VMs and containers without DMI are common, the reason would
        # repeat at every publish, and the label itself says `unknown`.
        log.debug("labels.machine_type.unreadable", path=str(path), error=err.strerror)
        return None
    if data is None:
        log.debug("labels.machine_type.unreadable", path=str(path), error="no such file")
        return None
    return data.decode(errors="replace")


def gfd_options(settings: Labels) -> GfdOptions:
    """The MIG strategy and machine type the labels are rendered with."""
    return GfdOptions(settings.mig_strategy, read_machine_type(settings.machine_type_file))
