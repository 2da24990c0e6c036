"""Files nodeagent writes at paths a user names: only regular files, written atomically.

Every write of a user-named path goes through here (the MPS ready markers, the NFD features
file, the device plugin config, the planned sharing config, the emulator's state, the MIG
writer lock). A target that is a symbolic link, a device node, a FIFO, a socket or a folder is
refused with one sentence (ConfigError, exit 2) before anything is written: a rename would
replace a device node, a link would be followed by the reader and a FIFO would block it.

Writes are atomic: a temporary file in the same folder, fsync, rename over the target, so a
reader (another process, a crash after the write) sees the old content or the new, never half
a file. `durable=False` skips the fsync: the rename stays atomic for readers, but after a power
loss the file may be empty or old (fine for data that need not outlive the machine).
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nodeagent.base.errors import AgentError, ConfigError

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# The errors that say the machine refused (exit 3), not that the path was wrong (exit 2).
SYSTEM_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE, errno.ENOMEM}
)


def kind_of(mode: int) -> str | None:
    """What a non-regular file is ('a symbolic link', 'a FIFO', ...); None for a regular file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def os_refusal(err: OSError, sentence: str) -> AgentError:
    """`sentence` as the error its OS error means: the machine refused (a full disk, a
    read-only file system, out of descriptors: exit 3), else the path was wrong (exit 2)."""
    cls = AgentError if err.errno in SYSTEM_ERRNOS else ConfigError
    return cls(f"{sentence}: {err.strerror or err}")


def _refuse(path: Path, what: str, kind: str) -> ConfigError:
    return ConfigError(f"{what} {path} is {kind}, not a regular file; remove it or name another")


def check_target(path: Path, what: str) -> None:
    """Raise ConfigError when `path` exists and is not a regular file (a link is not followed).
    A path that cannot be looked at is left for the write to report."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    kind = kind_of(mode)
    if kind is not None:
        raise _refuse(path, what, kind)


def atomic_write_text(
    path: Path, text: str, mode: int | None = None, *, durable: bool = True, what: str = "file"
) -> None:
    """Replace the regular file `path` with `text` atomically (creating its folder). Raises
    ConfigError when `path` is anything but a regular file (or absent), OSError when the
    write fails. With `durable` (the default) the data reach the disk before the rename."""
    check_target(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=path.parent)
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


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


_RANDOM = re.compile(r"[a-z0-9_]{8}")  # tempfile.mkstemp's part of the name


def interrupted_writes(path: Path) -> list[Path]:
    """The temporary files that atomic_write_text left beside `path` when the process was
    killed between creating one and renaming it over `path` (`.<name>.<8 random characters>`;
    readers never see them, and nothing else removes them). Raises OSError when the folder
    cannot be listed (an absent one holds none)."""
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    prefix = _temp_prefix(path)
    return sorted(
        path.parent / n
        for n in names
        if n.startswith(prefix) and _RANDOM.fullmatch(n[len(prefix) :])
    )


class UnreadableFile(ConfigError):
    """An input file is missing or the system refused to read it (as opposed to a file that
    is there but is no input: a folder, a device, a FIFO, a link loop, too large). `errno`:
    the OS error's number, where there was one."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


class FileTooLarge(ConfigError):
    """An input file is larger than its reader takes."""


def _size(max_bytes: int) -> str:
    if max_bytes >= 1 << 20 and not max_bytes % (1 << 20):
        return f"{max_bytes >> 20} MiB"
    return f"{max_bytes} bytes"


def _unreadable(path: Path | str, what: str, err: OSError) -> ConfigError:
    if err.errno == errno.ELOOP:
        return ConfigError(
            f"cannot read {what} {path}: it is a loop of symbolic links (or a chain of too"
            " many); name the file itself"
        )
    return UnreadableFile(f"cannot read {what} {path}: {err.strerror or err}", err.errno)


def read_regular(path: Path | str, what: str, max_bytes: int) -> bytes | None:
    """The bytes of the regular file `path` names, or None when it does not exist: the one
    way nodeagent opens an input file (configs, checkpoints, records, TLS files, kubeconfigs,
    tokens, sysfs and procfs files). A link is followed (Kubernetes mounts ConfigMap files as
    links); opened O_NONBLOCK|O_NOCTTY|O_CLOEXEC, so a FIFO never blocks and a terminal never
    becomes ours; a device node is never opened (opening one can act). Raises ConfigError
    naming `what` and the path for anything but a regular file and a loop of links,
    FileTooLarge for more than `max_bytes`, UnreadableFile when the system refuses."""
    try:
        kind = kind_of(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _unreadable(path, what, err) from err
    if kind is not None:
        raise _refuse_read(path, what, kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _unreadable(path, what, err) from err
    try:
        st = os.fstat(fd)
        kind = kind_of(st.st_mode)
        if kind is not None:  # swapped in after the check: still never read
            raise _refuse_read(path, what, kind)
        if st.st_size > max_bytes:
            raise FileTooLarge(f"cannot read {what} {path}: it is larger than {_size(max_bytes)}")
        chunks: list[bytes] = []
        left = max_bytes + 1  # a file that grows while read (or procfs, size 0) stays bounded
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as err:
        raise _unreadable(path, what, err) from err
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileTooLarge(f"cannot read {what} {path}: it is larger than {_size(max_bytes)}")
    return data


def read_input(path: Path | str, what: str, max_bytes: int) -> bytes:
    """`read_regular` of a file that must be there: raises UnreadableFile when it is not."""
    data = read_regular(path, what, max_bytes)
    if data is None:
        raise UnreadableFile(
            f"cannot read {what} {path}: {os.strerror(errno.ENOENT)}", errno.ENOENT
        )
    return data


def is_pipe(path: Path | str) -> bool:
    """Whether `path` names a pipe: process substitution's `/dev/fd/N`, a named FIFO."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def read_pipe(
    path: Path | str,
    what: str,
    max_bytes: int,
    timeout_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """What the pipe `path` gives until its writer closes it (`-f <(generate)`): at most
    `max_bytes`, within `timeout_seconds` in all. Opened O_NONBLOCK, so a FIFO nobody opened
    for writing reads as empty at once, never blocks. Raises FileTooLarge, ConfigError (not a
    pipe, or a writer that did not finish in time), UnreadableFile when the system refuses."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise _unreadable(path, what, err) from err
    chunks: list[bytes] = []
    size = 0
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # swapped after the check: never read
            raise ConfigError(f"cannot read {what} {path}: it is not a pipe")
        deadline = clock() + timeout_seconds
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:  # the writer is there and has not written yet
                left = deadline - clock()
                if left <= 0:
                    raise ConfigError(
                        f"cannot read {what} {path}: its writer did not finish within"
                        f" {timeout_seconds:g} s"
                    ) from None
                poller.poll(max(1, int(left * 1000)))
                continue
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise FileTooLarge(
                    f"cannot read {what} {path}: it is larger than {_size(max_bytes)}"
                )
            chunks.append(chunk)
    except OSError as err:
        raise _unreadable(path, what, err) from err
    finally:
        os.close(fd)
    return b"".join(chunks)


_READ_WORDS = {"a folder": "a directory", "a named pipe (FIFO)": "a FIFO"}


def _refuse_read(path: Path | str, what: str, kind: str) -> ConfigError:
    return ConfigError(
        f"cannot read {what} {path}: it is {_READ_WORDS.get(kind, kind)}, not a file"
    )


def write_if_changed(path: Path, text: str, what: str, mode: int | None = None) -> bool:
    """Write `text` atomically unless the regular file holds it already; return whether it
    was written. Raises ConfigError (not a regular file) or OSError."""
    data = text.encode()
    check_target(path, what)
    try:
        same = read_regular(path, what, len(data)) == data
    except FileTooLarge:
        same = False
    if same:
        return False
    atomic_write_text(path, text, mode, what=what)
    return True


def open_lock_file(path: Path, what: str) -> int:
    """A read-write descriptor of the regular file `path`, created when absent (mode 0644),
    for an flock. Raises ConfigError for a link, a device node, a FIFO, a folder, or a path
    that cannot be opened; AgentError (exit 3) when the machine refused (disk full,
    read-only file system, out of descriptors)."""
    check_target(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644
        )
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refuse(path, what, "a symbolic link") from err
        raise os_refusal(err, f"cannot open {what} {path}") from err
    kind = kind_of(os.fstat(fd).st_mode)
    if kind is not None:  # swapped in after the check: still never used
        os.close(fd)
        raise _refuse(path, what, kind)
    return fd


def entry_of(folder: Path, name: str, what: str) -> Path:
    """`folder / name` where `name` names one entry of `folder` itself, so that removing it
    never reaches outside `folder`. Raises ConfigError for a name with '/', a NUL byte, or
    that is empty, '.' or '..'."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ConfigError(
            f"{what} {name!r} is not a name within {folder}; nothing there was removed"
        )
    return folder / name


def link_between(top: Path, target: Path) -> Path | None:
    """The first component of `target` below `top` (`top` itself is the operator's: never
    looked at) that is a symbolic link or anything but a folder, `target` included; None
    when each one there is a real folder, up to the first that does not exist yet (a mkdir
    makes it inside the real folders above). Before a mkdir, a daemon's start or an rmtree
    under a plugin directory: a link in any component would move it to where it points.
    A `target` not below `top` counts as such a component itself."""
    try:
        parts = target.relative_to(top).parts
    except ValueError:
        return target
    path = top
    for part in parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError:
            return path
        if not stat.S_ISDIR(mode):
            return path
    return None


def remove_regular(path: Path, what: str) -> None:
    """Remove the regular file `path` if it is there. Raises ConfigError when it is anything
    else (a device node or a folder is never removed; nor is a link: it is not ours)."""
    check_target(path, what)
    path.unlink(missing_ok=True)


def chmod_folder(path: Path, mode: int, what: str) -> None:
    """Set the mode of the folder `path` itself: a symbolic link there is refused, never
    followed (a link to /root would open it to every user). Raises ConfigError for anything
    but a folder, OSError when the mode cannot be set."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = kind_of(os.lstat(path).st_mode) or "a regular file"
            raise ConfigError(f"{what} {path} is {kind}, not a folder") from err
        raise
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
