"""GPM (GPU performance monitoring) for the emulator, driven by the emulated processes' load.

Each emulated process has a `load` (0-1: the share of its device's SMs it keeps busy). A GPU
instance is as busy as the sum of its processes' loads (at most 1); a MIG GPU as busy as its
instances weighted by their SMs; a full GPU as the sum of its processes' loads. The metric
ratios per unit of load are those seen on the real H200 under an fp16 matmul loop (SM_UTIL
96.5, SM_OCCUPANCY 14.3, ANY_TENSOR_UTIL 93.7, DRAM_BW_UTIL 15.7).
"""

from __future__ import annotations

import ctypes
import itertools
import time
from dataclasses import dataclass
from typing import Any

import pynvml

from nodeagent.sim.models import load_model
from nodeagent.sim.state import SimState

# metric id -> percent at full load, from the H200 capture
PER_LOAD = {
    # Not in the capture: any kernel running counts as graphics-engine activity, so a loaded
    # GPU reads (nearly) 100.
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 99.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 96.5,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 14.3,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 93.7,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 15.7,
}
_SAMPLE_KIND = 5


@dataclass(frozen=True)
class Activity:
    """How busy every GPU and GPU instance is (0-1), from one pass over the processes."""

    gpus: dict[int, float]
    gis: dict[tuple[int, int], float]  # by (GPU, GI id)

    def gi(self, gpu: int, gi_id: int) -> float:
        return self.gis.get((gpu, gi_id), 0.0)


def node_activity(state: SimState) -> Activity:
    """A GPU instance is as busy as the sum of its processes' loads (at most 1); a MIG GPU as
    its instances weighted by their SMs; a full GPU as the sum of its processes' loads."""
    by_gpu: dict[int, float] = {}
    by_gi: dict[tuple[int, int], float] = {}
    for p in state.processes:
        by_gpu[p.gpu] = by_gpu.get(p.gpu, 0.0) + p.load
        if p.gi_id is not None:
            by_gi[(p.gpu, p.gi_id)] = by_gi.get((p.gpu, p.gi_id), 0.0) + p.load
    gis = {key: min(1.0, load) for key, load in by_gi.items()}
    gpus = {}
    for gpu in state.gpus:
        if not gpu.mig_current:
            gpus[gpu.index] = min(1.0, by_gpu.get(gpu.index, 0.0))
            continue
        model = load_model(gpu.model)
        total = max(p.multiprocessor_count for p in model.profiles)
        busy = 0.0
        for gi in gpu.gis.values():
            profile = model.profile_by_id(gi.profile_id)
            if profile is not None:
                busy += gis.get((gpu.index, gi.id), 0.0) * profile.multiprocessor_count
        gpus[gpu.index] = min(1.0, busy / total) if total else 0.0
    return Activity(gpus, gis)


class GpmSamples:
    """The emulator's GPM sample buffers: synthetic handles -> (time, activity)."""

    def __init__(self) -> None:
        self._serial = itertools.count(1)
        self._samples: dict[int, tuple[float, float] | None] = {}

    def alloc(self) -> Any:
        addr = (_SAMPLE_KIND << 40) | next(self._serial)
        self._samples[addr] = None
        sample = ctypes.cast(ctypes.c_void_p(addr), pynvml.c_nvmlGpmSample_t)
        sample.sim_address = addr  # read back without a ctypes.cast per call
        return sample

    def _addr(self, sample: Any) -> int:
        addr = getattr(sample, "sim_address", None)
        if addr is None:
            addr = ctypes.cast(sample, ctypes.c_void_p).value or 0
        if addr not in self._samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return addr

    def free(self, sample: Any) -> None:
        del self._samples[self._addr(sample)]

    def record(self, sample: Any, activity: float) -> None:
        self._samples[self._addr(sample)] = (time.monotonic(), activity)

    def metrics(self, request: Any) -> Any:
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._samples[self._addr(request.sample1)]
        second = self._samples[self._addr(request.sample2)]
        if first is None or second is None or second[0] <= first[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        activity = (first[1] + second[1]) / 2
        metrics = request.metrics
        for i in range(request.numMetrics):
            metric = metrics[i]
            per_load = PER_LOAD.get(metric.metricId)
            if per_load is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                metric.value = 0.0
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = round(per_load * activity, 3)
        return request
