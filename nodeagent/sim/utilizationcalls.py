"""Emulated NVML calls: per-process utilization samples (nvmlDeviceGetProcessUtilization).

The emulated driver takes a sample of every process every SAMPLE_PERIOD_US of the health clock
(NVML documents a period of 1 s to 1/6 s by product; the emulator takes 1/6 s). A process's
sample follows its `load` (`nodeagent sim attach --load`): SM utilization load x 100 %, memory
load x 22 % (as nvmlDeviceGetUtilizationRates answers for the GPU), no encoder or decoder use.
As the real driver does, a query returns only processes with non-zero utilization, only samples
newer than the caller's `lastSeenTimeStamp` (NOT_FOUND when there is none), and NOT_SUPPORTED
on a MIG-enabled GPU or a MIG device (nvml.h: "On MIG-enabled GPUs, querying process
utilization is not currently supported"), on every model (A100, A30, H100, H200, ...).

MPS clients are sampled like any process, by their own load: whether a real driver puts an MPS
client's SM use on the client or on its server is what benchmarks/mps_attribution.py measures;
a test that wants the server to carry it gives the server the load and the clients none.
"""

from __future__ import annotations

from typing import Any

import pynvml

from nodeagent.sim.base import _KIND_MIG, SimBase, _decode, _fail, nvml_call

SAMPLE_PERIOD_US = 1_000_000 // 6
MEMORY_PER_LOAD = 22  # percent of memory utilization at full load, as in the GPU's rates


class UtilizationCalls(SimBase):
    # -- per-process utilization ------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        if _decode(handle)[0] == _KIND_MIG:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu, _ = self._gpu(handle)
        if gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now_us = int(self.health_clock() * 1_000_000)
        sampled_at = now_us - now_us % SAMPLE_PERIOD_US
        busy = [p for p in self._processes_on(gpu.index) if round(p.load * 100) > 0]
        if sampled_at <= int(timeStamp) or not busy:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for p in busy:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp = p.pid, sampled_at
            sample.smUtil = round(p.load * 100)
            sample.memUtil = round(p.load * MEMORY_PER_LOAD)
            sample.encUtil = sample.decUtil = 0
            out.append(sample)
        return out
