"""The emulator's base: handles, the call wrapper (init check, state sync, faults, save), state.

The NVML emulator is an object that stands in for the `pynvml` module.

It has pynvml's function names and signatures (the ctypes array + count-by-reference list
calls included), returns pynvml's ctypes structures and raises pynvml's `NVMLError_*`
classes, so `nodeagent.nvml` runs on it unchanged. It enforces what the hardware enforces
(see DESIGN.md, "The emulator"). Handles are ctypes pointers of pynvml's handle types whose
addresses encode (kind, gpu, gi, ci); they are never dereferenced.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from threading import get_ident
from typing import Any, TypeVar

import pynvml

from nodeagent.base.errors import AgentError, SimError
from nodeagent.base.files import open_lock_file
from nodeagent.sim.faults import FaultPlan, SimulatedCrash
from nodeagent.sim.gpm import Activity, GpmSamples, node_activity
from nodeagent.sim.models import (
    DeviceModel,
    ProfileModel,
    load_model,
)
from nodeagent.sim.rules import device_memory
from nodeagent.sim.state import (
    CiState,
    GiState,
    GpuState,
    SimState,
    fresh_state,
)
from nodeagent.sim.statefile import Stamp, StateWriter, file_stamp, load_state, real_path

F = TypeVar("F", bound=Callable[..., Any])

_KIND_DEVICE, _KIND_MIG, _KIND_GI, _KIND_CI = 1, 2, 3, 4
NO_ID = 0xFFFFFFFF
MAX_MIG_DEVICES = 7


def _fail(code: int) -> Any:
    raise pynvml.NVMLError(code)


# Handles made so far, by (address, pointer type): a handle is an immutable value, and
# ctypes.cast (the only way to make one) costs more than the rest of most emulated calls.
_HANDLES: dict[tuple[int, Any], Any] = {}


def _handle(kind: int, gpu: int, gi: int = 0, ci: int = 0, ptype: Any = None) -> Any:
    addr = (kind << 40) | ((gpu + 1) << 24) | ((gi + 1) << 12) | (ci + 1)
    key = (addr, ptype or pynvml.c_nvmlDevice_t)
    handle = _HANDLES.get(key)
    if handle is None:
        handle = ctypes.cast(ctypes.c_void_p(addr), key[1])
        handle.sim_address = (kind, gpu, gi, ci)  # what _decode would find in it
        _HANDLES[key] = handle
    return handle


def _decode(handle: Any) -> tuple[int, int, int, int]:
    known = getattr(handle, "sim_address", None)
    if known is not None:
        return known  # type: ignore[no-any-return]
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[no-any-return]
    return addr >> 40, ((addr >> 24) & 0xFFFF) - 1, ((addr >> 12) & 0xFFF) - 1, (addr & 0xFFF) - 1


def _ref_value(ref: Any) -> Any:
    """The ctypes object behind byref(x) or pointer(x)."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


def nvml_call(mutating: bool = False) -> Callable[[F], F]:
    """Wrap an emulated NVML function: init check, state sync, fault injection, save."""

    def wrap(fn: F) -> F:
        name = fn.__name__
        needs_init = name not in ("nvmlInit", "nvmlInitWithFlags")

        def body(self: SimBase, lock: BatchLock, args: Any, kwargs: Any) -> Any:
            if needs_init and not self._initialized:
                _fail(pynvml.NVML_ERROR_UNINITIALIZED)
            fired = self.faults.on_call(name, mutating)
            for fault in fired:
                if fault.when == "before":
                    self._fire(fault)
            if mutating:
                lock.writing = True
                with self._transaction(True, _changed_gpu(args)):
                    result = fn(self, *args, **kwargs)
                delay = self.latency.get(name)
                if delay:  # the driver blocks its caller for the change: modelled, opt-in
                    self.sleep(delay)
            else:  # the hot path (an inventory read is ~750 calls): no context manager
                if lock.writing or not lock.synced:  # see BatchLock
                    self._sync()
                    lock.synced = True
                result = fn(self, *args, **kwargs)
            for fault in fired:
                if fault.when == "after":
                    self._fire(fault)
            return result

        @functools.wraps(fn)
        def inner(self: SimBase, *args: Any, **kwargs: Any) -> Any:
            # NVML is thread-safe; so is the emulator (the agent samples from threads). A call
            # inside a hold of this thread (the session's inventory read, a GPM tick) is
            # already serialised: taking the lock again would only cost (~2 us a call).
            lock = self.batch_lock
            if lock.owner == get_ident():
                return body(self, lock, args, kwargs)
            with lock:
                return body(self, lock, args, kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def _changed_gpu(args: tuple[Any, ...]) -> set[int] | None:
    """The GPU a mutating call changes: the one its first argument (a handle) names."""
    if not args:
        return None
    try:
        return {_decode(args[0])[1]}
    except pynvml.NVMLError:
        return None


class BatchLock:
    """The emulator's reentrant lock, lent to the NVML session (`batch_lock`): what a reader
    reads while it holds it is one state, and the state file is checked for another
    process's change once per outermost hold, not on every call (a GPM tick is ~130 calls,
    an inventory read ~750: each an os.stat before). A hold that changes the GPUs reads the
    file again on every call from its first change on: an apply waits on other programs (a
    GPU reset command) under the lock. Writes always read the file again under its lock
    (SimBase._transaction), so no other process's change is ever lost."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # changed only by the thread that holds _lock
        # The thread that holds it (threading.get_ident()), None while free: only the holder
        # ever finds its own id here, so it can be read without the lock.
        self.owner: int | None = None
        self.synced = False  # the state is the file's as of this hold
        self.writing = False  # this hold changed the GPUs: every read checks the file
        # Values derived from the state (activity, MIG devices), kept while it cannot change:
        # until this hold ends, the state is read again, or a call changes it.
        self.derived: dict[Any, Any] = {}

    def __enter__(self) -> BatchLock:
        self._lock.acquire()
        self._depth += 1
        self.owner = get_ident()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            self.synced = self.writing = False
            self.derived.clear()
            self.owner = None
        self._lock.release()


class SimBase:
    """State, plumbing and shared helpers of the emulator; the NVML calls are in the mixins."""

    # Wall clock of the health counters: energy must grow across the separate processes that
    # share a state file. Tests replace it per instance.
    health_clock: Callable[[], float] = time.time
    # Seconds a mutating call takes, by NVML function (benchmarks/dra.py models the driver's
    # MIG operations with it; NODEAGENT_SIM_LATENCY, see latency.py); none by default: the
    # tests run at the emulator's own speed.
    latency: Mapping[str, float] = {}

    def __init__(
        self,
        models: list[str],
        state_path: Path | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML", "c_nvml", "nvmlFriendly", "nvmlStructTo")):
                setattr(self, name, getattr(pynvml, name))
        self.__name__ = "nodeagent.sim"
        self.faults = faults or FaultPlan()
        self.sleep: Callable[[float], None] = time.sleep  # of `latency`; tests pass their own
        self.batch_lock = BatchLock()
        self._path = state_path
        self._stamp: Stamp | None = None
        self._writer = StateWriter()
        self._initialized = 0
        self._gpm = GpmSamples()
        loaded = self._load_or_create(models) if state_path else None
        if loaded is not None and loaded.models != models:
            raise SimError(
                f"emulator state file {state_path} holds GPUs {','.join(loaded.models)} "
                f"but the simulate spec asks for {','.join(models)}; "
                "use another --sim-state file or delete this one"
            )
        self.state = loaded or fresh_state(models)

    def _load_or_create(self, models: list[str]) -> SimState:
        """The state file's state; a file that does not exist yet is created (under its lock,
        so that two processes starting at once cannot overwrite each other's first change)."""
        assert self._path is not None
        read = load_state(self._path)
        if read is None:
            with self._file_lock():
                read = load_state(self._path)
                if read is None:
                    state = fresh_state(models)
                    self._stamp = self._writer.save(self._path, state, None, None)
                    return state
        self._stamp = read[1]
        return read[0]

    # -- plumbing ---------------------------------------------------------------------------

    def _fire(self, fault: Any) -> None:
        if fault.exit_code is not None:
            if self.faults.in_process:
                raise SimulatedCrash(f"simulated kill (exit {fault.exit_code})")
            os._exit(fault.exit_code)
        _fail(fault.error)

    def _sync(self) -> None:
        """Reload the state file when another process changed it."""
        if self._path is None or file_stamp(self._path) in (self._stamp, None):
            return
        read = load_state(self._path)
        if read is not None:
            self.state, self._stamp = read
            self._writer.forget()
            self.batch_lock.derived.clear()

    @contextmanager
    def _transaction(self, mutating: bool, changed: set[int] | None = None) -> Iterator[None]:
        """Sync with the file; after a mutation, write it (`changed`: the GPUs it changed,
        None: anything). The file's lock is held from the read to the write."""
        if self._path is None:
            yield
            return
        if not mutating:
            self._sync()
            yield
            return
        with self._file_lock():
            self._sync()
            try:
                yield
            finally:
                self.batch_lock.derived.clear()
            self._stamp = self._writer.save(self._path, self.state, changed, self._stamp)

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Hold the lock beside the state file (beside the file a link points to, so a link
        and its target share one lock)."""
        assert self._path is not None
        target = real_path(self._path)
        lock_path = target.with_name(target.name + ".lock")
        if not target.parent.is_dir():
            raise SimError(
                f"cannot write emulator state file {self._path}: no folder {target.parent}"
            )
        try:
            fd = open_lock_file(lock_path, "the emulator state file's lock")
        except AgentError as err:
            raise SimError(f"cannot lock emulator state file {self._path}: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def edit(self) -> Iterator[SimState]:
        """Change the state outside NVML (attach a process, reset a GPU), persisted atomically."""
        with self.batch_lock as lock, self._transaction(True):
            lock.writing = True
            yield self.state

    def _gpu(self, handle: Any, allow_mig: bool = False) -> tuple[GpuState, DeviceModel]:
        kind, gpu, _, _ = _decode(handle)
        if kind not in (_KIND_DEVICE, _KIND_MIG) or (kind == _KIND_MIG and not allow_mig):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= gpu < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state = self.state.gpus[gpu]
        return state, load_model(state.model)

    def _mig_on(self, gpu: GpuState) -> None:
        if not gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _gi(self, handle: Any) -> tuple[GpuState, DeviceModel, GiState]:
        kind, gpu_index, gi_id, _ = _decode(handle)
        if kind != _KIND_GI or not 0 <= gpu_index < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.state.gpus[gpu_index]
        self._mig_on(gpu)
        gi = gpu.gis.get(gi_id)
        if gi is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None
        return gpu, load_model(gpu.model), gi

    def _ci(self, handle: Any) -> tuple[GpuState, GiState, CiState]:
        kind, gpu_index, gi_id, ci_id = _decode(handle)
        if kind != _KIND_CI or not 0 <= gpu_index < len(self.state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.state.gpus[gpu_index]
        self._mig_on(gpu)
        gi = gpu.gis.get(gi_id)
        ci = gi.cis.get(ci_id) if gi else None
        if gi is None or ci is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None and ci is not None
        return gpu, gi, ci

    def _derived(self, key: Any, compute: Callable[[], Any]) -> Any:
        """A value computed from the state, computed once while the state cannot change."""
        derived = self.batch_lock.derived
        if key not in derived:
            derived[key] = compute()
        return derived[key]

    def _activity(self) -> Activity:
        return self._derived("activity", lambda: node_activity(self.state))  # type: ignore[no-any-return]

    def _load(self, gpu: GpuState) -> float:
        """How busy the GPU is (0-1), as GPM sees it."""
        return self._activity().gpus[gpu.index]

    def _mig_devices(self, gpu: GpuState) -> list[tuple[GiState, CiState]]:
        return self._derived(  # type: ignore[no-any-return]
            ("mig-devices", gpu.index),
            lambda: [(gi, gi.cis[c]) for _, gi in sorted(gpu.gis.items()) for c in sorted(gi.cis)],
        )

    def _mig_target(self, handle: Any) -> tuple[GpuState, DeviceModel, GiState, CiState]:
        kind, _gpu_index, gi_id, ci_id = _decode(handle)
        if kind != _KIND_MIG:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, model = self._gpu(handle, allow_mig=True)
        gi = gpu.gis.get(gi_id)
        ci = gi.cis.get(ci_id) if gi else None
        if gi is None or ci is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        assert gi is not None and ci is not None
        return gpu, model, gi, ci

    def _processes_on(self, gpu: int, gi: int | None = None, ci: int | None = None) -> list[Any]:
        return [
            p
            for p in self.state.processes
            if p.gpu == gpu and (gi is None or p.gi_id == gi) and (ci is None or p.ci_id == ci)
        ]

    def _profile(self, model: DeviceModel, profile_id: int) -> ProfileModel:
        profile = model.profile_by_id(profile_id)
        if profile is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert profile is not None
        return profile

    def _memory(self, handle: Any) -> tuple[int, int]:
        """(total, used) bytes of a GPU or MIG device."""
        if _decode(handle)[0] == _KIND_MIG:
            gpu, model, gi, ci = self._mig_target(handle)
            total, reserved = device_memory(model, self._profile(model, gi.profile_id))
            procs = self._processes_on(gpu.index, gi.id, ci.id)
        else:
            gpu, model = self._gpu(handle)
            total, reserved = device_memory(model, None)
            procs = self._processes_on(gpu.index)
        return total, reserved + sum(p.memory_bytes for p in procs)
