"""Talking to nvidia-cuda-mps-control: one command per process, on its stdin, never a shell.

The daemon answers exit code 0 to everything it receives and silently ignores bad values, so
callers read every setting back.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nodeagent.base.errors import ConfigError, MpsError
from nodeagent.base.files import FileTooLarge, UnreadableFile, link_between, read_regular
from nodeagent.base.logs import get_logger
from nodeagent.base.units import decimal, whole_number

NO_DAEMON = "Cannot find MPS control daemon process"
ALREADY_RUNNING = "An instance of this daemon is already running"
PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_BINARY = "nvidia-cuda-mps-control"
log = get_logger("nodeagent.mps")


@dataclass(frozen=True)
class MpsControl:
    binary: str
    pipe_dir: Path
    log_dir: Path
    timeout_seconds: float = 5.0

    def env(self, visible_devices: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        return env

    def command(self, line: str) -> str:
        """Send one command; return the answer (stripped). Raises MpsError when the daemon is
        not there, the control program fails, its answer is not UTF-8 text, or the round trip
        exceeds the timeout."""
        try:
            proc = subprocess.run(
                [self.binary],
                input=(line + "\n").encode(),
                capture_output=True,
                env=self.env(),
                timeout=self.timeout_seconds,
            )
        except subprocess.TimeoutExpired as err:
            raise MpsError(
                f"MPS control daemon did not answer {line!r} within {self.timeout_seconds:g} s"
            ) from err
        except OSError as err:
            raise self._cannot_run(err) from err
        answer = _text(line, proc.stdout).strip()
        if proc.returncode != 0:
            said = answer or proc.stderr.decode(errors="replace").strip()[:_SHOWN]
            raise MpsError(f"MPS control {line!r} failed: {said or proc.returncode}")
        return answer

    def percentage(self, line: str) -> float:
        """The answer to `line` read as a percentage ('25.0'). Raises MpsError as `command`
        does, and when the answer is not ASCII digits with an optional fraction."""
        answer = self.command(line)
        value = decimal(answer)
        if value is None:
            raise MpsError(
                f"the MPS control program answered {line!r} with {_shown(answer)}, not a percentage"
            )
        return value

    def server_pids(self) -> list[int]:
        """The pids of the daemon's MPS servers (`get_server_list`). Raises MpsError as
        `command` does, and when a line of the answer is not a pid (_pids)."""
        return _pids("get_server_list", self.command("get_server_list"))

    def client_pids(self, server: int) -> list[int]:
        """The pids of the clients of MPS server `server` (`get_client_list <server>`; none
        when that server is gone). Raises MpsError as server_pids does."""
        line = f"get_client_list {server}"
        return _pids(line, self.command(line))

    def _cannot_run(self, err: OSError) -> MpsError:
        """Why the control program did not run, in words (never an OSError's repr)."""
        if isinstance(err, FileNotFoundError):
            return MpsError(
                f"nvidia-cuda-mps-control not found at {self.binary} (install the NVIDIA"
                " driver's MPS tools or set mps.control)"
            )
        if isinstance(err, PermissionError):
            return MpsError(f"nvidia-cuda-mps-control at {self.binary} may not be run here")
        return MpsError(f"cannot run {self.binary}: {err.strerror or 'it failed to start'}")

    def start_daemon(self, visible_devices: str) -> None:
        """`nvidia-cuda-mps-control -d` with the pipe/log directories and CUDA_VISIBLE_DEVICES.
        Raises MpsError (a pipe or log folder that is a link: no_link)."""
        for folder, what in ((self.pipe_dir, "pipe"), (self.log_dir, "log")):
            no_link(folder, f"MPS {what} folder")
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise MpsError(f"cannot make MPS directory {folder}: {err.strerror}") from err
        try:
            proc = subprocess.run(
                [self.binary, "-d"],
                capture_output=True,
                env=self.env(visible_devices),
                timeout=max(self.timeout_seconds, 10),
            )
        except OSError as err:
            raise self._cannot_run(err) from err
        except subprocess.TimeoutExpired as err:
            raise MpsError(
                f"the MPS control daemon ({self.binary} -d) did not start within"
                f" {max(self.timeout_seconds, 10):g} s"
            ) from err
        if proc.returncode != 0:
            text = (proc.stdout + proc.stderr).decode(errors="replace").strip()[: _SHOWN * 4]
            raise MpsError(f"the MPS control daemon did not start: {text or proc.returncode}")

    def daemon_devices(self, pid: int) -> list[str] | None:
        """The CUDA_VISIBLE_DEVICES the daemon `pid` was started with (None: unknown)."""
        try:
            environ = (proc_file(pid, "environ") or b"").split(b"\0")
        except ConfigError:
            return None
        for item in environ:
            if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                value = item.split(b"=", 1)[1].decode(errors="replace")
                return [d for d in value.split(",") if d]
        return None

    def served_devices(self) -> list[str]:
        """The GPU UUIDs a daemon running in this pipe directory serves (none when no daemon
        runs there, or its environment cannot be read)."""
        pid = self.daemon_pid()
        return (self.daemon_devices(pid) or []) if pid is not None else []

    def daemon_pid(self) -> int | None:
        """The daemon's pid from its pid file, if that process is alive and is an MPS control
        daemon. A pid file naming another process (the daemon died and its pid was reused) is
        stale: it is removed with a warning and that process is left alone. Raises ConfigError
        when the pid file is not a regular file."""
        path = self.pipe_dir / PID_FILE
        if self.pipe_dir.is_symlink():  # another daemon's folder, perhaps: never ours
            return None
        try:
            data = read_regular(path, "the MPS control daemon's pid file", 64)
            text = data.decode(errors="replace").strip() if data is not None else ""
            pid = whole_number(text, PID_DIGITS) or 0
        except (UnreadableFile, FileTooLarge):
            return None
        if pid <= 0 or not process_alive(pid):
            return None
        argv = process_argv(pid)
        if argv is None:  # gone since, or not ours to read: nothing is known of it
            return None
        if is_control_daemon(pid, argv, self.binary):
            return pid
        log.warning("mps.stale_pid_file", path=str(path), pid=pid, process=argv[0])
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def no_link(folder: Path, what: str, top: Path | None = None) -> None:
    """Raise MpsError when `folder` is a symbolic link, or with `top` (the plugin directory)
    when any folder between `top` and `folder` is one (or no folder): a daemon's folder is
    never followed through one (its pipe, log and pid file would be written, another daemon
    found, and its folder removed, where it points)."""
    if folder.is_symlink():
        raise MpsError(
            f"the {what} {folder} is a symbolic link; nodeagent does not follow it (the"
            " daemon's files would be written where it points): remove it"
        )
    link = link_between(top, folder) if top is not None else None
    if link is not None:
        raise MpsError(
            f"{link} is a symbolic link or no folder; nodeagent does not follow it to the"
            f" {what} {folder} (the daemon's files would be written, and removed, where it"
            " points): remove it"
        )


def removable(folder: Path, what: str, top: Path) -> bool:
    """Whether a daemon's `folder` below `top` (the plugin directory) may be stopped and
    removed: True when no symbolic link lies on the way (no_link); False when one does but
    nothing is behind it (no folder, an empty one: the undo of a start it refused), so
    nothing is done there. Raises MpsError (no_link's sentence) when one does and something
    is there: it is not followed, nothing is stopped or removed."""
    if not folder.is_symlink() and link_between(top, folder) is None:
        return True
    with contextlib.suppress(OSError):
        if not folder.exists() or not any(folder.iterdir()):
            return False
    no_link(folder, what, top)
    return False  # not reached: no_link raised


_SHOWN = 64  # characters of an answer an error quotes
PID_DIGITS = 10  # a Linux pid is below 2^22 (pid_max); a 32-bit one has at most 10 digits


def _shown(answer: str) -> str:
    return repr(answer if len(answer) <= _SHOWN else answer[: _SHOWN - 1] + "…")


def _text(line: str, data: bytes) -> str:
    """The control program's answer to `line` as text. Raises MpsError when it is not UTF-8."""
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        raise MpsError(
            f"the MPS control program answered {line!r} with bytes that are not UTF-8 text"
            f" ({data[err.start : err.start + 8]!r} at byte {err.start})"
        ) from err


def _pids(line: str, answer: str) -> list[int]:
    """A pid list, one per line: `get_server_list`'s, `get_client_list`'s (whose `Server <pid>
    not found` says the server is gone: no clients). Raises MpsError for any other line,
    digits that are not ASCII among them."""
    if answer.startswith("Server ") and answer.endswith(" not found"):
        return []
    out = []
    for item in answer.split("\n"):
        pid = whole_number(item.strip(), PID_DIGITS)
        if pid is not None and pid > 0:
            out.append(pid)
        elif item.strip():
            raise MpsError(
                f"the MPS control program answered {line!r} with {_shown(item.strip())}, not a"
                " process id (ASCII digits)"
            )
    return out


def limit_holds(got: int | None, want: int) -> bool:
    """Whether a pinned memory limit read back (`got` bytes, None: unset) is the `want` bytes
    set: the daemon prints a limit of 1 GiB or more in whole G, truncated (35942M reads back
    as 35G on a real H200), so the wanted value cut to whole GiB holds too."""
    if got is None:
        return False
    return got == want or (want >= 1 << 30 and got == want >> 30 << 30)


PROC_FILE_BYTES = 1 << 20  # an environment or a command line is at most a few 100 KiB


def proc_file(pid: int, name: str) -> bytes | None:
    """/proc/<pid>/<name>, read as every input is (nodeagent.base.files.read_regular); None when
    the process is gone. Raises ConfigError (UnreadableFile: not ours to read)."""
    return read_regular(f"/proc/{pid}/{name}", f"process {pid}'s {name}", PROC_FILE_BYTES)


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name; [] when it cannot be read."""
    try:
        data = proc_file(pid, "stat")
    except ConfigError:
        return []
    return data.decode(errors="replace").rsplit(")", 1)[-1].split() if data else []


def process_alive(pid: int) -> bool:
    """Running, not a zombie (an exited process not yet reaped)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def parent_pid(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except (IndexError, ValueError):
        return None


def process_argv(pid: int) -> list[str] | None:
    """The process's argv; None when it cannot be read (gone, or not ours to read)."""
    try:
        raw = proc_file(pid, "cmdline") or b""
    except ConfigError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def is_control_daemon(pid: int, argv: list[str], binary: str) -> bool:
    """Whether the process is nvidia-cuda-mps-control (or `binary`): its executable, its
    argv[0], or the script a Python interpreter runs (its first argument that is not an
    option: `python3 -IS /path/nvidia-cuda-mps-control -d`, as the test double). Not any
    program's argument: `less /path/nvidia-cuda-mps-control` is not the daemon."""
    names = {Path(binary).name, Path(DEFAULT_BINARY).name}
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = ""
    script = ""
    if Path(argv[0]).name.startswith("python"):
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
    return any(Path(a).name in names for a in (exe, argv[0], script) if a)
