"""GFD's options from nodeagent's settings; the one read of the host they need."""

from __future__ import annotations

from pathlib import Path

from nodeagent.base.configfile import read_bytes
from nodeagent.base.errors import ConfigError
from nodeagent.base.files import UnreadableFile
from nodeagent.base.logs import get_logger
from nodeagent.labels.gfd import GfdOptions
from nodeagent.settings import Labels

log = get_logger("nodeagent.labels")


def read_machine_type(path: Path) -> str | None:
    """The machine-type file's content (GFD's --machine-type-file; the DMI product name by
    default), or None where it cannot be read: gpu.machine is then `unknown`, as in GFD. A
    path that is no regular file (a FIFO a publish would block on, /dev/zero, a folder) or is
    larger than nodeagent.base.configfile.MAX_FILE_BYTES is never read: a warning, and `unknown`."""
    try:
        return read_bytes(str(path), "machine-type file").decode("utf-8", "replace")
    except UnreadableFile as err:
        # Debug, not a warning: VMs and containers without DMI are common, the reason would
        # repeat at every publish, and the label itself says `unknown`.
        log.debug("labels.machine_type.unreadable", path=str(path), error=str(err))
    except ConfigError as err:
        log.warning("labels.machine_type.refused", error=str(err))
    return None


def gfd_options(settings: Labels) -> GfdOptions:
    """The MIG strategy and machine type the labels are rendered with."""
    return GfdOptions(settings.mig_strategy, read_machine_type(settings.machine_type_file))
