"""The node side of the DRA driver: prepare and unprepare claims on this node's GPUs.

`prepare` is idempotent and converges after a crash at any step: the claim and what it will
create go into the checkpoint before the first mutation; the MIG operations run under the
node-wide MIG writer lock (as `nodeagent mig apply` and the reconcile pipeline take it) and are
planned from what NVML reports, so a retry finishes what a killed run began (a GI left without
its CI gets its CI); the MPS daemon is adopted if it runs; the CDI spec and the checkpoint
(`prepared`) are written last. `unprepare` undoes what the claim created, and only that; an
unknown claim is already unprepared.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nodeagent.dra import cdi
from nodeagent.dra.checkpoint import PREPARED, PREPARING, PreparedClaim, PreparedDevice, load, save
from nodeagent.dra.claims import ClaimRef, claimed_devices
from nodeagent.dra.operations import destroy_ops, intents, plan_claim, slice_at
from nodeagent.errors import AgentError, MigError
from nodeagent.files import atomic_write_text
from nodeagent.logs import get_logger
from nodeagent.mig.apply import Reset, execute
from nodeagent.mig.plan import GpuPlan, Plan
from nodeagent.mps.daemon import MpsDaemon
from nodeagent.mps.settings import Limits, MpsSettings, validate
from nodeagent.nvml import Inventory, MigWriter, NvmlSession, read_inventory

log = get_logger("nodeagent.dra")
CHECKPOINT_NAME = "checkpoint.json"


@dataclass(frozen=True)
class NodeConfig:
    """Where the driver keeps its state and what it manages."""

    driver: str
    pool: str  # the node's name
    plugin_dir: Path  # checkpoint.json, mps/<claim uid>/...
    cdi_dir: Path
    gpus: Collection[int] | None = None  # None: every GPU
    mps_control: str = "nvidia-cuda-mps-control"

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / CHECKPOINT_NAME


@dataclass(frozen=True)
class Prepared:
    """What the kubelet hears for one device: its request, pool, name and CDI ids."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


class NodeDriver:
    """Prepares claims. `writer_lock` is the MIG writer lock; `held` says which GPU or MIG
    UUIDs pods hold through the device plugin (kubelet pod-resources)."""

    def __init__(
        self,
        session: NvmlSession,
        config: NodeConfig,
        reset: Reset,
        writer_lock: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        held: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.session = session
        self.config = config
        self.reset = reset
        self.writer_lock = writer_lock
        self.held = held
        self._lock = threading.Lock()  # one claim at a time: the checkpoint is one file

    # -- prepare ------------------------------------------------------------------------------

    def prepare(self, ref: ClaimRef, claim: Mapping[str, Any]) -> list[Prepared]:
        """Make the claim's devices ready. Raises ConfigError (a bad claim), SliceInUse (a
        device overlaps a busy slice or another claim's), NvmlError, MpsError."""
        c = self.config
        # The writer lock (a file lock) around all of it: another process preparing (an old
        # agent still stopping) never interleaves its checkpoint or its MIG operations.
        with self._lock, self.writer_lock():
            checkpoint = load(c.checkpoint)
            before = checkpoint.claims.get(ref.uid)
            if before is not None and before.state == PREPARED:
                gone = self._gone(ref.uid, before)
                if gone is None:
                    return _answer(before)
                # A reboot (MIG slices, /var/run/cdi and MPS daemons do not survive one; the
                # checkpoint does), or someone destroyed it: made again, as NVIDIA's driver
                # drops a checkpoint of an earlier boot.
                log.warning("dra.prepare_again", claim=str(ref), gone=gone)
            claimed = claimed_devices(claim, c.driver, c.pool)
            held = dict(self.held())
            with self.session.lock:
                inventory = read_inventory(self.session)
                wanted = intents(inventory, claimed, before.devices if before else (), c.gpus)
                the_plan = plan_claim(inventory, ref.uid, wanted, checkpoint, held)
                record = PreparedClaim(ref.namespace, ref.name, PREPARING, tuple(wanted))
                save(c.checkpoint, checkpoint.with_claim(ref.uid, record))
                self._execute(the_plan, ref)
                after = read_inventory(self.session)
                made = _made(after, wanted, ref)
            made = [self._start_mps(ref.uid, d, after) for d in made]
            ids = tuple(cdi.cdi_id(c.driver, ref.uid, d.device) for d in made)
            self._write_cdi(ref.uid, made)
            record = PreparedClaim(ref.namespace, ref.name, PREPARED, tuple(made), ids)
            save(c.checkpoint, load(c.checkpoint).with_claim(ref.uid, record))
            log.info("dra.prepared", claim=str(ref), devices=[d.device for d in made])
            return _answer(record)

    def _gone(self, uid: str, claim: PreparedClaim) -> str | None:
        """What of a prepared claim is no longer there (None: all of it is)."""
        if not cdi.spec_file(self.config.cdi_dir, self.config.driver, uid).exists():
            return "its CDI spec"
        with self.session.lock:
            gpus = {g.index: g for g in read_inventory(self.session).gpus}
        for d in claim.devices:
            if d.is_mig:
                gpu = gpus.get(d.gpu)
                s = slice_at(gpu, d.profile_id or 0, d.placement_start or 0) if gpu else None
                if s is None or s.mig_uuid != d.mig_uuid:
                    return f"the MIG device of {d.device}"
            if d.mps is not None and self._mps_stopper(uid, d).control.daemon_pid() is None:
                return f"the MPS daemon of {d.device}"
        return None

    def _mps_stopper(self, uid: str, d: PreparedDevice) -> MpsDaemon:
        """The claim's MPS daemon for `d`, as far as asking for its pid or stopping it goes."""
        root = self.mps_root(uid, d.device)
        settings = MpsSettings(
            devices=(d.gpu,), pipe_dir=root / "pipe", log_dir=root / "log",
            ready_file=root / "ready", control_binary=self.config.mps_control,
        )  # fmt: skip
        return MpsDaemon(settings, Limits(100, {}, d.gpu_uuid))

    def _execute(self, the_plan: Plan, ref: ClaimRef) -> None:
        if the_plan.operations:
            log.info("dra.mig", claim=str(ref), operations=len(the_plan.operations))
            execute(the_plan, MigWriter(self.session), self.reset)

    def _start_mps(self, uid: str, d: PreparedDevice, inventory: Inventory) -> PreparedDevice:
        if d.mps is None:
            return d
        root = self.mps_root(uid, d.device)
        self._mps_daemon(d, root, inventory).start()  # adopts the daemon of an earlier try
        return replace(d, mps={**d.mps, "pipe_dir": str(root / "pipe")})

    def mps_root(self, uid: str, device: str) -> Path:
        """The claim's MPS daemon for one device: <plugin dir>/mps/<uid>/<device>/{pipe,log}."""
        return self.config.plugin_dir / "mps" / uid / device

    def _mps_daemon(self, d: PreparedDevice, root: Path, inventory: Inventory) -> MpsDaemon:
        assert d.mps is not None
        pinned = d.mps.get("pinned_memory_bytes")
        settings = MpsSettings(
            devices=(d.gpu,),
            thread_percentage=int(d.mps["thread_percentage"]),
            pinned_memory={d.gpu: f"{int(pinned) >> 20}M"} if pinned else {},
            pipe_dir=root / "pipe",
            log_dir=root / "log",
            ready_file=root / "ready",
            control_binary=self.config.mps_control,
        )
        limits = validate(settings, inventory)
        if not pinned:  # no limit asked: none set (validate's default is memory / replicas)
            limits = Limits(limits.thread_percentage, {}, limits.visible_devices)
        return MpsDaemon(settings, limits)

    def _write_cdi(self, uid: str, devices: list[PreparedDevice]) -> None:
        path = cdi.spec_file(self.config.cdi_dir, self.config.driver, uid)
        text = cdi.render_text(self.config.driver, uid, devices)
        try:
            atomic_write_text(path, text, mode=0o644)
        except OSError as err:
            raise AgentError(f"cannot write the CDI spec {path}: {err.strerror}") from err

    # -- unprepare ----------------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        """Undo what the claim created: its MPS daemon, the MIG slices it made (slices that
        were there before stay), its CDI spec; then forget it. Raises SliceInUse when a slice
        still has processes or a pod holds it (the kubelet asks again), KubeError when the
        kubelet cannot say which devices pods hold, NvmlError, MpsError."""
        c = self.config
        with self._lock, self.writer_lock():
            claim = load(c.checkpoint).claims.get(uid)
            if claim is None:
                return
            for d in claim.devices:
                if d.mps is not None:
                    self._mps_stopper(uid, d).stop()
            held = dict(self.held())  # a device-plugin pod handed the claim's slice
            with self.session.lock:
                inventory = read_inventory(self.session)
                self._execute(Plan(_destroys(inventory, claim, held)), ClaimRef("", "", uid))
            cdi.spec_file(c.cdi_dir, c.driver, uid).unlink(missing_ok=True)
            save(c.checkpoint, load(c.checkpoint).without(uid))
            log.info("dra.unprepared", claim=str(claim))


def _answer(claim: PreparedClaim) -> list[Prepared]:
    by_device = dict(zip((d.device for d in claim.devices), claim.cdi_ids, strict=False))
    return [Prepared(d.request, d.pool, d.device, (by_device[d.device],)) for d in claim.devices]


def _made(
    inventory: Inventory, wanted: list[PreparedDevice], ref: ClaimRef
) -> list[PreparedDevice]:
    """Each wanted device with the ids of the MIG device now there. Raises MigError when one
    is missing after the operations (NVML did not do what it said)."""
    gpus = {g.index: g for g in inventory.gpus}
    out = []
    for d in wanted:
        if not d.is_mig:
            out.append(d)
            continue
        s = slice_at(gpus[d.gpu], d.profile_id or 0, d.placement_start or 0)
        if s is None or s.mig_uuid is None:
            raise MigError(f"{ref}: GPU {d.gpu} has no {d.profile} slice at {d.placement_start}")
        out.append(replace(d, gi_id=s.gi_id, ci_id=s.ci_id, mig_uuid=s.mig_uuid))
    return out


def _destroys(
    inventory: Inventory, claim: PreparedClaim, held: Mapping[str, str]
) -> tuple[GpuPlan, ...]:
    """The GpuPlans that destroy the slices this claim created (found by profile and
    placement: after a crash their ids may not be in the checkpoint). Raises SliceInUse when
    one still has processes or a pod holds it (`held`)."""
    gpus = {g.index: g for g in inventory.gpus}
    plans = []
    for d in claim.devices:
        if d.is_mig and not d.existed and d.gpu in gpus:
            mine = slice_at(gpus[d.gpu], d.profile_id or 0, d.placement_start or 0)
            if mine is not None:
                plans.append(GpuPlan(d.gpu, tuple(destroy_ops(gpus[d.gpu], [mine], held))))
    return tuple(plans)
