"""Utilization that needs no GPM (so also on Ampere: A100, A30, A800): per GPU
(nvmlDeviceGetUtilizationRates) and per process (nvmlDeviceGetProcessUtilization); and which
processes are MPS clients (nvmlDeviceGetMPSComputeRunningProcesses), with their memory.

Neither works on a MIG-enabled GPU: NVML's header (nvml.h, both functions) says "On MIG-enabled
GPUs, querying device utilization rates / process utilization is not currently supported", and
the driver answers NOT_SUPPORTED. Per slice, only GPM (Hopper and later) measures activity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.nvml.codes import FUNCTION_NOT_FOUND, NOT_FOUND, NOT_SUPPORTED, SUCCESS
from nodeagent.nvml.session import NvmlSession, gpu_handle

MpsClients = dict[int, int | None]  # pid -> device memory used in bytes (None: NVML does not say)

# pynvml raises NVMLError(SUCCESS) when the sizing call finds nothing to size: no samples.
_UNSUPPORTED = (NOT_SUPPORTED, FUNCTION_NOT_FOUND)
# The longest driver sample period (nvmlUtilization_t: "between 1 second and 1/6 second").
MAX_SAMPLE_PERIOD_US = 1_000_000


@dataclass(frozen=True)
class UtilizationRates:
    """nvmlDeviceGetUtilizationRates as ratios 0-1: the share of the driver's last sample
    period (1 s to 1/6 s by product, nvmlUtilization_t) in which a kernel ran (`gpu`) and in
    which device memory was read or written (`memory`)."""

    gpu: float
    memory: float


@dataclass(frozen=True)
class ProcessSample:
    """One process's utilization in one driver sample (nvmlProcessUtilizationSample_t), as
    ratios 0-1; `timestamp_us` is the CPU time of the sample in microseconds."""

    pid: int
    timestamp_us: int
    sm: float
    memory: float
    encoder: float
    decoder: float


def idle_sample(pid: int) -> ProcessSample:
    """What a running process NVML sent no sample for had: no utilization (NVML returns only
    processes with non-zero utilization in the samples asked for)."""
    return ProcessSample(pid=pid, timestamp_us=0, sm=0.0, memory=0.0, encoder=0.0, decoder=0.0)


def _ratio(percent: Any) -> float:
    return min(max(int(percent), 0), 100) / 100.0


def read_rates(session: NvmlSession, index: int) -> UtilizationRates | None:
    """GPU and memory utilization of GPU `index`; None where NVML has none (MIG-enabled
    GPUs). nvidia-smi equivalent: `--query-gpu=utilization.gpu,utilization.memory`."""
    dev = gpu_handle(session, index)
    rates = session.sensor("nvmlDeviceGetUtilizationRates", dev, context=f"GPU {index}")
    return None if rates is None else UtilizationRates(_ratio(rates.gpu), _ratio(rates.memory))


class ProcessUtilizationReader:
    """Reads each GPU's per-process samples since the last read of that GPU, so each driver
    sample is counted once: NVML returns only samples newer than the `lastSeenTimeStamp` it
    is given, and the reader keeps the newest timestamp it saw per GPU UUID.

    NVML returns a process only if it had non-zero utilization in the samples asked for; a
    process it leaves out was idle. A GPU that answers NOT_SUPPORTED (MIG enabled, a driver
    without the call) is not asked again until `forget()`.
    """

    def __init__(self, session: NvmlSession) -> None:
        self.session = session
        self._last: dict[str, int] = {}
        self._unsupported: set[str] = set()

    def read(self, index: int, uuid: str) -> dict[int, ProcessSample] | None:
        """The newest sample of each process with one since the last read, by pid; None when
        the GPU does not report per-process utilization. nvidia-smi equivalent: `nvidia-smi
        pmon -c 1 -s u`. Raises NvmlError for a failure other than "not supported"."""
        if uuid in self._unsupported:
            return None
        dev = gpu_handle(self.session, index)
        last = self._last.get(uuid, 0)
        try:
            raw = self.session.call(
                "nvmlDeviceGetProcessUtilization",
                dev,
                last,
                context=f"GPU {index}",
                absent=(NOT_FOUND, SUCCESS),  # no sample newer than `last`
            )
        except NvmlError as err:
            if err.code in _UNSUPPORTED:
                self._unsupported.add(uuid)
                return None
            raise
        newest: dict[int, ProcessSample] = {}
        for s in raw or ():
            stamp, pid = int(s.timeStamp), int(s.pid)
            if pid == 0 or stamp <= last:  # unfilled entries of the caller's buffer
                continue
            if pid not in newest or stamp > newest[pid].timestamp_us:
                newest[pid] = ProcessSample(
                    pid, stamp, _ratio(s.smUtil), _ratio(s.memUtil), _ratio(s.encUtil),
                    _ratio(s.decUtil),
                )  # fmt: skip
        if newest:
            self._last[uuid] = max(s.timestamp_us for s in newest.values())
        return newest

    def newest(self, uuid: str) -> int:
        """The timestamp (microseconds) of the newest sample read from GPU `uuid`; 0: none."""
        return self._last.get(uuid, 0)

    def forget(self, uuid: str) -> None:
        """Ask GPU `uuid` again from its first sample (its MIG mode changed)."""
        self._last.pop(uuid, None)
        self._unsupported.discard(uuid)


def read_mps_clients(session: NvmlSession, handle: Any, context: str = "") -> MpsClients | None:
    """The MPS clients running on a GPU or MIG device (`handle`), by pid, with the device memory
    each uses; None where NVML does not list them (NOT_SUPPORTED, or a driver without the
    call) or the read failed (counted in the session's errors). The MPS server itself is not
    listed: on a real H200 nvmlDeviceGetComputeRunningProcesses lists the server and its
    clients, this call the clients only (../shared/fixtures/mps/h200-control-protocol.md).
    nvidia-smi equivalent: the `M+C` rows of `nvidia-smi`'s process table."""
    procs = session.sensor(
        "nvmlDeviceGetMPSComputeRunningProcesses",
        handle,
        context=context,
        absent=(FUNCTION_NOT_FOUND,),
    )
    if procs is None:
        return None
    return {int(p.pid): None if p.usedGpuMemory is None else int(p.usedGpuMemory) for p in procs}
