"""The reconcile loop: wires NVML, MIG geometry and metrics. Steps have names that appear in
logs and in failure reasons."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from prometheus_client.registry import CollectorRegistry

from nodeagent.errors import AgentError, ConfigError
from nodeagent.metrics.agent import AgentCollector, AgentStats
from nodeagent.metrics.collectorset import CollectorSet
from nodeagent.metrics.exposition import ExpositionCache
from nodeagent.metrics.gpus import GpuCollector
from nodeagent.metrics.sampling import GpmSampler, Periodic, refresh_inventory
from nodeagent.metrics.server import DEFAULT_METRICS_ADDRESS, MetricsServer
from nodeagent.metrics.slices import SliceCollector
from nodeagent.metrics.store import Store
from nodeagent.mig.apply import Reset, reconfigure
from nodeagent.mig.config import parse_config
from nodeagent.nvml import NvmlSession
from nodeagent.nvml.gpm import GpmReader

log = structlog.get_logger("nodeagent.agent")


@dataclass(frozen=True)
class AgentConfig:
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    refresh_interval_seconds: float = 5.0
    gpm_interval_seconds: float = 1.0
    reconcile_interval_seconds: float = 30.0
    mig_config_file: str | None = None
    mig_config: str | None = None

    def validate(self) -> None:
        for name in (
            "refresh_interval_seconds",
            "gpm_interval_seconds",
            "reconcile_interval_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be > 0")
        if self.gpm_interval_seconds < 0.1:
            raise ConfigError("gpm interval must be at least 0.1 s (two GPM samples need 100 ms)")
        if bool(self.mig_config_file) != bool(self.mig_config):
            raise ConfigError("a MIG config needs both the file and the name (-f and -c)")


class Agent:
    """One node's agent. Build it, then `start()` (threads + HTTP) or drive it step by step."""

    def __init__(
        self,
        session: NvmlSession,
        config: AgentConfig,
        reset: Reset,
        clock: Callable[[], float] = time.time,
    ) -> None:
        config.validate()
        self.session = session
        self.config = config
        self.reset = reset
        self.clock = clock
        self.store = Store()
        self.stats = AgentStats()
        self.gpm = GpmSampler(GpmReader(session), self.store, time.monotonic)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            CollectorSet(
                [
                    GpuCollector(self.store),
                    SliceCollector(self.store),
                    AgentCollector(self.stats, self.store, lambda: session.errors_by_function),
                ]
            )
        )
        self.exposition = ExpositionCache(self.registry)
        self.stop_event = threading.Event()
        self.last_error: str | None = None
        self.reconciled = False
        self._threads: list[Periodic] = []
        self.server: MetricsServer | None = None

    # -- steps ----------------------------------------------------------------------------

    def refresh(self) -> None:
        refresh_inventory(self.session, self.store, self.clock)
        self.exposition.render()

    def sample_gpm(self) -> None:
        self.gpm.tick()
        self.exposition.render()

    def reconcile(self) -> str:
        """Observe, then bring MIG to the configured config if there is one. Returns
        'success' or 'failure'; the reason of a failure is in `last_error`."""
        start = time.monotonic()
        step = "observe"
        try:
            self.refresh()
            if self.config.mig_config_file and self.config.mig_config:
                step = "read-config"
                path = self.config.mig_config_file
                try:
                    text = Path(path).read_text()
                except OSError as err:
                    raise ConfigError(
                        f"cannot read MIG config file {path}: {err.strerror}"
                    ) from err
                cfg = parse_config(text, path)
                step = "apply-mig"
                outcome = reconfigure(self.session, cfg, self.config.mig_config, self.reset)
                if outcome.done:
                    log.info(
                        "mig.changed", config=self.config.mig_config, operations=len(outcome.done)
                    )
                step = "publish"
                self.refresh()
            result, self.last_error = "success", None
        except AgentError as err:
            result, self.last_error = "failure", f"{step}: {err}"
            log.error("reconcile.failed", step=step, error=str(err))
        self.stats.record(result, time.monotonic() - start, self.clock())
        self.reconciled = True
        self.exposition.render()
        return result

    # -- health ---------------------------------------------------------------------------

    def healthy(self) -> tuple[bool, str]:
        age = self.clock() - self.store.inventory_time
        limit = 3 * self.config.refresh_interval_seconds + 5
        if self.store.inventory is None:
            return False, "no GPU inventory read yet"
        if age > limit:
            return False, f"GPU inventory is {age:.0f} s old (limit {limit:.0f} s)"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self.reconciled or self.store.inventory is None:
            return False, "first reconcile not done"
        if self.last_error:
            return False, self.last_error
        return True, "ok"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.server = MetricsServer(
            self.config.metrics_address, self.exposition.latest, self.healthy, self.ready
        )
        self.reconcile()
        self.server.start()
        self._threads = [
            Periodic(
                "refresh", self.refresh, self.config.refresh_interval_seconds, self.stop_event
            ),
            Periodic("gpm", self.sample_gpm, self.config.gpm_interval_seconds, self.stop_event),
            Periodic(
                "reconcile",
                self.reconcile_quiet,
                self.config.reconcile_interval_seconds,
                self.stop_event,
            ),
        ]
        for t in self._threads:
            t.start()

    def reconcile_quiet(self) -> None:
        self.reconcile()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=10)
        if self.server:
            self.server.stop()
        self.gpm.close()
