"""GFD's options from nodeagent's settings; the one read of the host they need."""

from __future__ import annotations

from pathlib import Path

from nodeagent.base.configfile import read_bytes
from nodeagent.base.files import UnreadableFile
from nodeagent.base.logs import get_logger
from nodeagent.labels.gfd import GfdOptions
from nodeagent.settings import Labels

log = get_logger("nodeagent.labels")


def read_machine_type(path: Path) -> str | None:
    """The machine-type file's content (GFD's --machine-type-file; the DMI product name by
    default), or None where it is absent or the system refuses it: gpu.machine is then
    `unknown`, as in GFD. Raises ConfigError (exit 2) for a path that is there but is no
    file to read (a FIFO a publish would block on, /dev/zero, a folder, a loop of links) or is
    larger than nodeagent.base.configfile.MAX_FILE_BYTES: a path the user named wrong."""
    try:
        return read_bytes(str(path), "machine-type file").decode("utf-8", "replace")
    except UnreadableFile as err:
        # Debug, not a warning: VMs and containers without DMI are common, the reason would
        # repeat at every publish, and the label itself says `unknown`.
        log.debug("labels.machine_type.unreadable", path=str(path), error=str(err))
    return None


def gfd_options(settings: Labels) -> GfdOptions:
    """The MIG strategy and machine type the labels are rendered with."""
    return GfdOptions(settings.mig_strategy, read_machine_type(settings.machine_type_file))
