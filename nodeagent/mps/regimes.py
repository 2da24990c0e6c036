"""Which MPS daemon runs on each GPU: the device-plugin path's (nodeagent.mps.manager, one
daemon for the GPUs of `mps.devices`) or the DRA share servers (nodeagent.mps.claims), never
both. Two MPS daemons on one GPU are two CUDA contexts the GPU time-slices against each other
(measured on an H200: 6.59 s each against 2.05 s for the same work under one daemon), so the
later one is refused with a sentence naming the other, and nothing of it is started.

One object per agent, shared by its MPS manager and its DRA driver (the agent's factory wires
it); the share servers that outlived an agent restart are registered again when the driver
starts (nodeagent.mps.claims.ClaimDaemons.adopt). Across processes: the pipeline reads the
claims' daemons from the ownership record (nodeagent.state.owners.claimed_mps), and a claim's
daemon looks for a pipeline daemon running in the pipe directory the settings name
(`pipeline_pipe`: a `sharing apply` or `mps start` of another process started it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from nodeagent.base.errors import AgentError, MpsError
from nodeagent.mps.control import MpsControl

PIPELINE = "the device-plugin path's MPS daemon (mps.devices)"


class MpsRegimes:
    """The GPUs of the pipeline's daemon and of each share server, under one lock."""

    def __init__(self, pipeline_pipe: Callable[[], Path | None] | None = None) -> None:
        # Where the pipeline's daemon has its pipe directory under the settings (None: not
        # known), for a daemon another process started there.
        self.pipeline_pipe = pipeline_pipe or (lambda: None)
        self._lock = threading.Lock()
        self._pipeline: frozenset[int] = frozenset()
        self._shares: dict[str, int] = {}  # share server name -> its GPU

    def pipeline(self, gpus: Collection[int], claimed: Mapping[int, str] | None = None) -> None:
        """The pipeline's daemon serves `gpus` from now (none: it stopped). Raises MpsError
        naming a share server on one of them, this process's or one of `claimed` ({GPU: the
        DRA MPS daemon the ownership record has there}, whichever process started it; nothing
        is taken then)."""
        with self._lock:
            known = {g: f"the DRA MPS share server {n}" for n, g in self._shares.items()}
            taken = sorted({**(claimed or {}), **known}.items())
            taken = [(g, what) for g, what in taken if g in set(gpus)]
            if taken:
                gpu, what = taken[0]
                raise MpsError(
                    f"GPU {gpu} runs {what}; {PIPELINE} is not"
                    f" started beside it (two MPS daemons on one GPU are time-sliced against"
                    f" each other): it waits until the DRA MPS claims on GPU {gpu} are gone, or"
                    " leave that GPU out of mps.devices"
                )
            self._pipeline = frozenset(gpus)

    def share(self, gpu: int, server: str, gpu_uuid: str = "") -> None:
        """The share server `server` runs on `gpu` from now. Raises MpsError when the
        pipeline's daemon serves that GPU (nothing is taken then)."""
        with self._lock:
            self._beside_pipeline(gpu, gpu_uuid, f"the DRA MPS share server {server}")
            self._shares[server] = gpu

    def claim_daemon(self, gpu: int, gpu_uuid: str, what: str) -> None:
        """A claim's own MPS daemon (`what`, an MpsConfig's) is about to start on `gpu`.
        Raises MpsError when the pipeline's daemon serves that GPU."""
        with self._lock:
            self._beside_pipeline(gpu, gpu_uuid, what)

    def _beside_pipeline(self, gpu: int, gpu_uuid: str, what: str) -> None:
        """Raise MpsError when the pipeline's daemon serves `gpu`: this process's, or one
        running in `pipeline_pipe` for the GPU `gpu_uuid` (started by another process)."""
        pid = None
        if gpu not in self._pipeline:
            pid = self._running_pipeline(gpu_uuid)
            if pid is None:
                return
        started = f" (pid {pid}, started by another process)" if pid is not None else ""
        raise MpsError(
            f"GPU {gpu} runs {PIPELINE}{started}; {what} is not started beside it (two MPS"
            f" daemons on one GPU are time-sliced against each other): leave GPU {gpu} out of"
            " mps.devices or of dra.devices"
        )

    def _running_pipeline(self, gpu_uuid: str) -> int | None:
        """The pid of a pipeline daemon running in `pipeline_pipe` for the GPU `gpu_uuid`
        (None: none, or it cannot be told)."""
        pipe = self.pipeline_pipe() if gpu_uuid else None
        if pipe is None:
            return None
        control = MpsControl("", pipe, pipe.parent / "log")
        with contextlib.suppress(AgentError):
            pid = control.daemon_pid()
            if pid is not None and gpu_uuid in (control.daemon_devices(pid) or ()):
                return pid
        return None

    def adopt(self, gpu: int, server: str) -> None:
        """A share server found running (an agent restart): registered whatever runs."""
        with self._lock:
            self._shares[server] = gpu

    def share_gone(self, server: str) -> None:
        with self._lock:
            self._shares.pop(server, None)

    def pipeline_gpus(self) -> frozenset[int]:
        with self._lock:
            return self._pipeline


__all__ = ["PIPELINE", "MpsRegimes"]
