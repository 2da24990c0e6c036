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
from nodeagent.base.files import FileTooLarge, UnreadableFile, read_regular
from nodeagent.base.logs import get_logger

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
        not there, the control program fails, or the round trip exceeds the timeout."""
        try:
            proc = subprocess.run(
                [self.binary],
                input=line + "\n",
                capture_output=True,
                text=True,
                env=self.env(),
                timeout=self.timeout_seconds,
            )
        except subprocess.TimeoutExpired as err:
            raise MpsError(
                f"MPS control daemon did not answer {line!r} within {self.timeout_seconds:g} s"
            ) from err
        except OSError as err:
            raise self._cannot_run(err) from err
        answer = proc.stdout.strip()
        if proc.returncode != 0:
            raise MpsError(
                f"MPS control {line!r} failed: {answer or proc.stderr.strip() or proc.returncode}"
            )
        return answer

    def server_pids(self) -> list[int]:
        """The pids of the daemon's MPS servers (`get_server_list`). Raises MpsError as
        `command` does."""
        return _pids(self.command("get_server_list"))

    def client_pids(self, server: int) -> list[int]:
        """The pids of the clients of MPS server `server` (`get_client_list <server>`).
        Raises MpsError as `command` does."""
        return _pids(self.command(f"get_client_list {server}"))

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
        """`nvidia-cuda-mps-control -d` with the pipe/log directories and CUDA_VISIBLE_DEVICES."""
        for folder in (self.pipe_dir, self.log_dir):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise MpsError(f"cannot make MPS directory {folder}: {err.strerror}") from err
        try:
            proc = subprocess.run(
                [self.binary, "-d"],
                capture_output=True,
                text=True,
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
            text = (proc.stdout + proc.stderr).strip()
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
        try:
            data = read_regular(path, "the MPS control daemon's pid file", 64)
            pid = int(data.decode().strip()) if data is not None else 0
        except (UnreadableFile, FileTooLarge, ValueError):
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


def _pids(answer: str) -> list[int]:
    return [int(x) for x in answer.split() if x.isdigit()]


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
