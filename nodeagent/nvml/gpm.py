"""GPM (GPU performance monitoring, Hopper+) reads: per GPU and per GPU instance.

Two samples at least 100 ms apart give the SM, occupancy, tensor and DRAM activity between
them. Utilization rates do not work on MIG GPUs; GPM does, per GPU instance.
"""

from __future__ import annotations

from typing import Any

from nodeagent.errors import NvmlError
from nodeagent.nvml.session import NvmlSession

# NVML_GPM_METRIC_* ids, by the name nodeagent exposes (as ratios 0-1).
GPM_METRICS = {
    "sm_active": 2,  # SM_UTIL
    "sm_occupancy": 3,  # SM_OCCUPANCY
    "tensor_active": 5,  # ANY_TENSOR_UTIL
    "dram_active": 10,  # DRAM_BW_UTIL
}


class GpmReader:
    """Thin typed access to the GPM calls through the session."""

    def __init__(self, session: NvmlSession) -> None:
        self.session = session

    def supported(self, index: int) -> bool:
        """Does the GPU support GPM? False for pre-Hopper GPUs (NOT_SUPPORTED)."""
        dev = self.session.call("nvmlDeviceGetHandleByIndex", index)
        support = self.session.read("nvmlGpmQueryDeviceSupport", dev)
        return bool(support is not None and support.isSupportedDevice)

    def sample(self, index: int, gi_id: int | None = None) -> Any:
        """Take a sample of the GPU, or of one of its GPU instances; the caller frees it.

        nvidia-smi equivalent: none (dcgmi dmon -e 1002 reads the same counters).
        """
        dev = self.session.call("nvmlDeviceGetHandleByIndex", index)
        sample = self.session.call("nvmlGpmSampleAlloc")
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
        self.session.call("nvmlGpmSampleFree", sample)

    def ratios(self, first: Any, second: Any) -> dict[str, float]:
        """The activity between two samples, as ratios 0-1 by metric name; metrics the GPU
        does not report are left out."""
        lib = self.session.lib
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for i, metric_id in enumerate(GPM_METRICS.values()):
            request.metrics[i].metricId = metric_id
        result = self.session.call("nvmlGpmMetricsGet", request)
        out = {}
        for i, name in enumerate(GPM_METRICS):
            metric = result.metrics[i]
            if metric.nvmlReturn == 0:
                out[name] = round(min(max(float(metric.value) / 100.0, 0.0), 1.0), 6)
        return out


def read_utilization(session: NvmlSession, index: int) -> float | None:
    """GPU utilization ratio (0-1) from nvmlDeviceGetUtilizationRates; None where NVML does not
    give it (MIG-enabled GPUs). nvidia-smi equivalent: `--query-gpu=utilization.gpu`."""
    dev = session.call("nvmlDeviceGetHandleByIndex", index)
    rates = session.read("nvmlDeviceGetUtilizationRates", dev)
    return None if rates is None else int(rates.gpu) / 100.0
