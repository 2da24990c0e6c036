"""Atomic file writes: a temporary file in the same folder, fsync, rename over the target.

A reader (another process, a crash after the write) sees the old content or the new, never
half a file. Used for the emulator's state, the MPS ready file and the NFD features file.
`durable=False` skips the fsync: the rename stays atomic for readers, but after a power loss
the file may be empty or old (fine for data that need not outlive the machine).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(
    path: Path, text: str, mode: int | None = None, *, durable: bool = True
) -> None:
    """Replace `path` with `text` atomically (creating its folder); raises OSError.

    With `durable` (the default) the data reach the disk before the rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
