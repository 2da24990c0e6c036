"""GPM (GPU performance monitoring, Hopper+) reads: per GPU and per GPU instance.

Two samples at least 100 ms apart give the SM, occupancy, tensor and DRAM activity between
them. Utilization rates do not work on MIG GPUs; GPM does, per GPU instance.
"""

from __future__ import annotations

from typing import Any

from nodeagent.base.errors import NvmlError
from nodeagent.nvml.session import NvmlSession, gpu_handle

# NVML_GPM_METRIC_* ids, by the name nodeagent exposes (as ratios 0-1).
GPM_METRICS = {
    "graphics_active": 1,  # GRAPHICS_UTIL
    "sm_active": 2,  # SM_UTIL
    "sm_occupancy": 3,  # SM_OCCUPANCY
    "tensor_active": 5,  # ANY_TENSOR_UTIL
    "dram_active": 10,  # DRAM_BW_UTIL
}


MAX_SPARE_SAMPLES = 1024  # freed sample buffers kept for the next samples (~a node's two ticks)


class GpmReader:
    """Thin typed access to the GPM calls through the session.

    A sampler takes a sample of every GPU and GPU instance each second and frees the one
    before: freed buffers are kept and filled again, and device handles (fixed while NVML is
    loaded) are looked up once, so a tick makes 2 NVML calls per GPU or GI instead of 5.
    """

    def __init__(self, session: NvmlSession) -> None:
        self.session = session
        self._spare: list[Any] = []
        self._request: tuple[Any, tuple[tuple[str, Any], ...]] | None = None

    def _device(self, index: int) -> Any:
        return gpu_handle(self.session, index)

    def supported(self, index: int) -> bool:
        """Does the GPU support GPM? False for pre-Hopper GPUs (NOT_SUPPORTED)."""
        support = self.session.read("nvmlGpmQueryDeviceSupport", self._device(index))
        return bool(support is not None and support.isSupportedDevice)

    def sample(self, index: int, gi_id: int | None = None) -> Any:
        """Take a sample of the GPU, or of one of its GPU instances; the caller frees it.

        nvidia-smi equivalent: none (dcgmi dmon -e 1002 reads the same counters).
        """
        dev = self._device(index)
        sample = self._spare.pop() if self._spare else self.session.call("nvmlGpmSampleAlloc")
        try:
            if gi_id is None:
                self.session.call("nvmlGpmSampleGet", dev, sample, context=f"GPU {index}")
            else:
                self.session.call(
                    "nvmlGpmMigSampleGet", dev, gi_id, sample, context=f"GPU {index} GI {gi_id}"
                )
        except NvmlError:
            self.free(sample)
            raise
        return sample

    def free(self, sample: Any) -> None:
        """Give a sample buffer back (kept for the next sample; see close())."""
        if len(self._spare) < MAX_SPARE_SAMPLES:
            self._spare.append(sample)
        else:
            self.session.call("nvmlGpmSampleFree", sample)

    def close(self) -> None:
        """Free the kept buffers (the samples still held are the caller's to free first)."""
        while self._spare:
            self.session.call("nvmlGpmSampleFree", self._spare.pop())

    def ratios(self, first: Any, second: Any) -> dict[str, float]:
        """The activity between two samples, as ratios 0-1 by metric name; metrics the GPU
        does not report are left out."""
        request, slots = self._request or self._new_request()
        with self.session.lock:  # one request, filled in and read back by one thread at once
            request.sample1, request.sample2 = first, second
            self.session.call("nvmlGpmMetricsGet", request)
            return {
                name: round(min(max(float(slot.value) / 100.0, 0.0), 1.0), 6)
                for name, slot in slots
                if slot.nvmlReturn == 0
            }

    def _new_request(self) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        """The metrics request, made once (19 KiB: room for every metric NVML knows) and
        filled in again for every pair of samples; its result slots by metric name."""
        lib = self.session.lib
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        metrics = request.metrics
        for i, metric_id in enumerate(GPM_METRICS.values()):
            metrics[i].metricId = metric_id
        slots = tuple((name, metrics[i]) for i, name in enumerate(GPM_METRICS))
        self._request = (request, slots)
        return self._request
