"""Emulated NVML calls: GPM samples and metrics."""

from __future__ import annotations

from typing import Any

import pynvml

from nodeagent.sim.base import (
    SimBase,
    _fail,
    nvml_call,
)


class GpmCalls(SimBase):
    # -- GPM --------------------------------------------------------------------------------

    @nvml_call()
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        _, model = self._gpu(device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(model.gpm_supported)
        return support

    @nvml_call()
    def nvmlGpmSampleAlloc(self) -> Any:
        return self._gpm.alloc()

    @nvml_call()
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gpm.free(gpmSample)

    @nvml_call()
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu, model = self._gpu(device)
        if not model.gpm_supported:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._gpm.record(gpmSample, self._load(gpu))
        return gpmSample

    @nvml_call()
    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu, model = self._gpu(device)
        if not model.gpm_supported:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._mig_on(gpu)
        if gpuInstanceId not in gpu.gis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        self._gpm.record(gpmSample, self._activity().gi(gpu.index, gpuInstanceId))
        return gpmSample

    @nvml_call()
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        return self._gpm.metrics(metricsGet)
