"""GFD's options from nodeagent's settings; the one read of the host they need."""

from __future__ import annotations

from pathlib import Path

from nodeagent.labels.gfd import GfdOptions
from nodeagent.logs import get_logger
from nodeagent.settings import Labels

log = get_logger("nodeagent.labels")


def read_machine_type(path: Path) -> str | None:
    """The machine-type file's content (GFD's --machine-type-file; the DMI product name by
    default), or None where it cannot be read: gpu.machine is then `unknown`, as in GFD."""
    try:
        return path.read_text(errors="replace")
    except OSError as err:
        # Debug, not a warning: VMs and containers without DMI are common, the reason would
        # repeat at every publish, and the label itself says `unknown`.
        log.debug("labels.machine_type.unreadable", path=str(path), error=err.strerror)
        return None


def gfd_options(settings: Labels) -> GfdOptions:
    """The MIG strategy and machine type the labels are rendered with."""
    return GfdOptions(settings.mig_strategy, read_machine_type(settings.machine_type_file))
