"""The one gateway to the NVML library: init once per process, every call mapped to NvmlError."""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.nvml.codes import GONE, LIBRARY_NOT_FOUND, NOT_SUPPORTED, message_for

_sessions: dict[int, NvmlSession] = {}
_sessions_lock = threading.Lock()


class NvmlSession:
    """An initialised NVML library (the real `pynvml` or the emulator).

    Use `open_session(lib)`: one session, one nvmlInit per library per process; nvmlShutdown
    runs at exit. `call(name, *args)` is the only way nodeagent reaches NVML.
    """

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.errors_by_function: Counter[str] = Counter()
        # NVML calls are serialised: a reader that holds the lock across a whole inventory
        # read (or a writer across a MIG change) sees and leaves one consistent state. The
        # error counter has a lock of its own. A library that serialises its own calls lends
        # its reentrant lock (`batch_lock`: the emulator, which then checks its state file
        # once per hold, not on every call); the real pynvml has none.
        lent = getattr(lib, "batch_lock", None)
        self.lock: Any = lent or threading.RLock()
        self._lib_locks = lent is not None  # each of its calls takes the lock itself
        # Answers that cannot change while NVML is loaded (a GPU's MIG profile tables), by
        # key; read and written under `lock`.
        self.static: dict[Any, Any] = {}
        self._errors_lock = threading.Lock()
        # Told the counts after each failed call (the agent's snapshot store, which the metrics
        # read): called under the error counter's lock, so the last told is the latest.
        self._error_listeners: list[Callable[[Mapping[str, int]], None]] = []
        self._closed = False
        self.call("nvmlInit")
        atexit.register(self.close)

    def call(
        self, function: str, *args: Any, context: str = "", absent: tuple[int, ...] = ()
    ) -> Any:
        """Call `lib.<function>(*args)`; raise NvmlError(code) from any NVMLError.

        Codes in `absent` are answers, not failures (a probe for a profile the GPU lacks, an
        empty MIG device index): they return None and are not counted as errors.
        """
        fn = getattr(self.lib, function)
        try:
            if self._lib_locks:
                return fn(*args)
            with self.lock:
                return fn(*args)
        except self.lib.NVMLError as err:
            code = int(getattr(err, "value", 999))
            if code in absent:
                return None
            with self._errors_lock:
                self.errors_by_function[function] += 1
                for listener in self._error_listeners:
                    listener(Counter(self.errors_by_function))
            raise NvmlError(code, function, message_for(code), context) from err

    def error_counts(self) -> Counter[str]:
        """A copy of the failed calls by function (safe to read from any thread)."""
        with self._errors_lock:
            return Counter(self.errors_by_function)

    def report_errors(self, listener: Callable[[Mapping[str, int]], None]) -> Callable[[], None]:
        """Tell `listener` the failed calls by function now and after each failure; returns
        the call that stops telling it."""
        with self._errors_lock:
            self._error_listeners.append(listener)
            listener(Counter(self.errors_by_function))

        def stop() -> None:
            with self._errors_lock:
                if listener in self._error_listeners:
                    self._error_listeners.remove(listener)

        return stop

    def read(self, function: str, *args: Any, context: str = "") -> Any:
        """Like call(), but a NOT_SUPPORTED answer becomes None (reads only, never writes)."""
        return self.call(function, *args, context=context, absent=(NOT_SUPPORTED,))

    def sensor(
        self, function: str, *args: Any, context: str = "", absent: tuple[int, ...] = ()
    ) -> Any:
        """One sensor value (a temperature, a counter, a utilization): like call(), but a
        failure of this read alone (UNKNOWN, TIMEOUT, NOT_SUPPORTED on one field of one GPU)
        costs only this value: None, counted in error_counts. Raises NvmlError only where
        NVML or the GPU itself is gone (uninitialised, no driver, GPU lost): every other read
        would fail too."""
        try:
            return self.call(function, *args, context=context, absent=(NOT_SUPPORTED, *absent))
        except NvmlError as err:
            if err.code in GONE:
                raise
            return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Shutdown at exit must never mask the real outcome of the command.
        with contextlib.suppress(Exception):
            self.lib.nvmlShutdown()


def open_session(lib: Any) -> NvmlSession:
    """The process's session for `lib`, initialising NVML on first use only."""
    with _sessions_lock:
        session = _sessions.get(id(lib))
        if session is None or session.lib is not lib or session._closed:
            session = NvmlSession(lib)
            _sessions[id(lib)] = session
        return session


def load_real_library() -> Any:
    """Import the real pynvml module (nvidia-ml-py). Raises NvmlError if it is missing."""
    try:
        import pynvml
    except ImportError as err:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlError(
            LIBRARY_NOT_FOUND, "import pynvml", "nvidia-ml-py is not installed"
        ) from err
    return pynvml


def gpu_handle(session: NvmlSession, index: int) -> Any:
    """GPU `index`'s device handle, asked of NVML once per session: a handle is fixed while
    NVML is loaded, and the samplers ask for it on every tick."""
    with session.lock:
        handles: dict[int, Any] = session.static.setdefault("gpu-handles", {})
        handle = handles.get(index)
        if handle is None:
            handle = handles[index] = session.call(
                "nvmlDeviceGetHandleByIndex", index, context=f"GPU {index}"
            )
        return handle
