"""The node side of the DRA driver: prepare and unprepare claims on this node's GPUs.

The driver translates: a claim's allocation becomes its claimed devices (nodeagent.dra.claims),
those the devices it will hold on this node's GPUs (nodeagent.dra.prepared), and those a value,
`ClaimChange`, that the reconcile pipeline plans, records and applies itself
(nodeagent.reconcile.claims): the owner checks against the node's ownership record
(nodeagent.state.owners, the one record of who holds what, read once when the change begins),
the claim recorded `preparing` under the node-wide MIG writer lock before the first NVML
operation, the hooks, step metrics and logs of every MIG change. The driver's checkpoint is
its view of the record, written by a listener it registers once on the record store at each
write (nodeagent.dra.checkpoint).

`prepare` is idempotent and converges after a crash at any step: a retry plans again from what
NVML reports (a GI left without its CI gets its CI); the MPS daemon is adopted if it runs; the
CDI spec and the record's `prepared` are written last. A prepare that fails undoes what it did
(nothing is left half held). `unprepare` undoes what the claim created, and only that: its MPS
daemon and directories, its MIG slices, its CDI spec (and the temporary file of a write of it
that a kill cut short), its records; an unknown claim is already unprepared. Claims are
prepared side by side: one claim's calls are serialised, and a claim waits for another only
while the pipeline holds the MIG writer lock for an NVML change.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from nodeagent.base.errors import AgentError, ConfigError, MigError
from nodeagent.base.files import atomic_write_text, entry_of, interrupted_writes
from nodeagent.base.logs import get_logger
from nodeagent.dra import cdi
from nodeagent.dra.checkpoint import (
    PREPARED,
    PREPARING,
    UNPREPARING,
    Checkpoint,
    PreparedClaim,
    load,
    save,
)
from nodeagent.dra.claims import ClaimRef, claimed_devices
from nodeagent.dra.inflight import InFlight, Superseded, Ticket
from nodeagent.dra.prepared import prepared_devices
from nodeagent.dra.status import device_data
from nodeagent.dra.users import PodUsers
from nodeagent.metrics.shares import ShareUsage, ShareView
from nodeagent.mps.claims import ClaimDaemons, ClaimDevice, ClaimLimits
from nodeagent.mps.regimes import MpsRegimes
from nodeagent.mps.servers import ShareKey, ShareServers
from nodeagent.nvml import Inventory, NvmlSession, read_inventory
from nodeagent.reconcile.claims import ChangeDone, ClaimChange, ClaimEngine, slice_at
from nodeagent.state.held import PreparedDevice
from nodeagent.state.owners import Owners, OwnerStore

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
    share_sm_limit: int = 100  # dra.mps-share-sm-limit: a share's SM limit where none is set

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / CHECKPOINT_NAME


@dataclass(frozen=True)
class Prepared:
    """What the kubelet hears for one device: its request, pool, name and CDI ids; and what
    preparing it made, for the claim's status (nodeagent.dra.status.device_data)."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    data: Mapping[str, Any] = field(default_factory=dict, compare=False)


class Stats(Protocol):
    """What the driver reports (nodeagent.metrics.dra.DraStats)."""

    def observe_prepare(self, kind: str, seconds: float, ok: bool) -> None: ...
    def observe_unprepare(self, kind: str, seconds: float, ok: bool) -> None: ...
    def observe_nvml(self, op: str, seconds: float) -> None: ...
    def refused(self, reason: str) -> None: ...
    def set_prepared(self, counts: Mapping[str, int]) -> None: ...
    def share_finding(self, reason: str) -> None: ...
    def set_shares_over(self, count: int) -> None: ...
    def set_shares(self, views: list[ShareView], inventory: Inventory) -> list[ShareUsage]: ...
    def set_shares_below(self, claims: frozenset[str]) -> None: ...
    def status_written(self, ok: bool) -> None: ...


def kind_of(devices: tuple[PreparedDevice, ...] | list[PreparedDevice]) -> str:
    """mig | mps | gpu | admin: what a claim's devices are, for the metrics."""
    if devices and all(d.admin for d in devices):
        return "admin"
    if any(d.mps for d in devices):
        return "mps"
    if any(d.is_mig for d in devices):
        return "mig"
    return "gpu"


def reason_of(err: BaseException) -> str:
    """A refusal's reason, as the metrics count it: the error's own (nodeagent.base.errors)."""
    return err.reason if isinstance(err, AgentError) else "other"


class NodeDriver:
    """Prepares claims. `engine` runs MIG changes (the reconcile pipeline); `owners` is the
    node's ownership record, shared with every other path; `stats` hears of each call."""

    def __init__(
        self,
        session: NvmlSession,
        config: NodeConfig,
        engine: ClaimEngine,
        owners: OwnerStore,
        stats: Stats | None = None,
        users: PodUsers | None = None,
        regimes: MpsRegimes | None = None,
    ) -> None:
        """`regimes`: the agent's, shared with its MPS manager (a share server and the
        device-plugin path's daemon exclude each other on a GPU)."""
        self.session = session
        self.config = config
        self.engine = engine
        self.owners = owners
        self.stats = stats
        self.daemons = ClaimDaemons(config.plugin_dir, config.mps_control, regimes)
        self.users = users  # a share claim's user from its pods' runAsUser (None: not read)
        self._guard = threading.Lock()
        self._fixed: Inventory | None = None  # the GPUs' fixed facts (`fixed`), read once
        # One call per claim at a time: each claim's lock and how many calls hold or wait
        # for it (dropped with the last, so a claim gone leaves nothing behind).
        self._claims: dict[str, tuple[threading.Lock, int]] = {}
        self.inflight = InFlight()  # the kubelet's prepares under way (nodeagent.dra.inflight)
        owners.listen(self._view)  # the checkpoint follows each write of the record

    def start(self) -> None:
        """Before the first claim: the ownership record is written now if there is none (or
        an unreadable one), rebuilt from the node once, so that claims prepared later are never
        mistaken for a lost record's traces (a record of before is sealed now, the
        checkpoints of before folded into it); then the checkpoint, its view, as it has the
        driver's claims, without the temporary file of a checkpoint write a kill interrupted (a
        claim's CDI spec write: its unprepare removes it); the share servers adopted; the GPUs'
        fixed facts read (`fixed`)."""
        self.owners.ensure()
        self.owners.update(lambda o: o, self._first_view)
        self.daemons.adopt(self.share_clients())
        self.fixed()

    @property
    def shares(self) -> ShareServers:
        """The share servers (their clients and stalls, for the watch)."""
        return self.daemons.servers

    def _first_view(self, owners: Owners) -> None:
        """The view at start, under the record's lock (every checkpoint write holds it: none
        is under way), its interrupted writes removed first."""
        try:
            for path in interrupted_writes(self.config.checkpoint):
                path.unlink(missing_ok=True)
        except OSError as err:  # litter, not a reason to serve no claim
            log.warning("dra.litter_left", path=str(err.filename), error=err.strerror)
        self._view(owners)

    @contextmanager
    def _claim(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._claims.get(uid, (threading.Lock(), 0))
            self._claims[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._claims[uid]
                if users == 1:
                    del self._claims[uid]
                else:
                    self._claims[uid] = (lock, users - 1)

    def _update(self, uid: str, entry: PreparedClaim | None, deadline: float | None = None) -> None:
        """Put (or drop, None) one claim in the ownership record: one read-modify-write,
        waited for until `deadline` (time.monotonic; None: the store's wait)."""
        self.owners.update(
            lambda o: o.with_claim(uid, entry) if entry else _dropped(o, uid, self.config.driver),
            wait_seconds=_left(deadline),
        )

    def _view(self, owners: Owners) -> None:
        """The checkpoint as the record has the driver's claims now, and the prepared claims'
        counts. A checkpoint that cannot be written is said (and /readyz says why), never a
        claim's failure: the driver decides from the record."""
        claims = owners.prepared_here(self.config.driver)
        try:
            save(self.config.checkpoint, Checkpoint(claims), durable=False)
        except ConfigError as err:
            log.warning("dra.checkpoint_unwritten", error=str(err))
        if self.stats is not None:
            counts: dict[str, int] = {}
            for c in claims.values():
                if c.state == PREPARED:
                    counts[kind_of(c.devices)] = counts.get(kind_of(c.devices), 0) + 1
            self.stats.set_prepared(counts)

    def recorded(self) -> dict[str, PreparedClaim]:
        """The claims the driver recorded (the ownership record's, with a state), read now."""
        return self.owners.read().prepared_here(self.config.driver)

    def problem(self) -> str | None:
        """Why the driver should not be trusted to serve claims now (its checkpoint, the view
        of its claims, is unreadable: a disk fault or a hand edit), for /readyz; None when it
        can."""
        try:
            load(self.config.checkpoint)
        except ConfigError as err:
            return (
                f"DRA: {err}; the claims are served from the ownership record, and the next"
                " change of one writes the checkpoint again (docs/dra.md: 'If the DRA"
                " checkpoint is unreadable')"
            )
        return None

    def inventory(self) -> Inventory:
        """The node's GPUs as NVML has them now (under the session's lock)."""
        with self.session.lock:
            return read_inventory(self.session)

    def fixed(self) -> Inventory:
        """The GPUs as first read, for their facts that never change while the driver runs:
        index, UUID, memory, MIG profiles and placements (what a claim's allocation names;
        nodeagent.dra.prepared). What is on them now is the engine's to read, under the MIG
        writer lock: a prepare makes no read of the GPUs of its own."""
        if self._fixed is None:
            self._fixed = self.inventory()
        return self._fixed

    # -- prepare ------------------------------------------------------------------------------

    def prepare(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        deadline: float | None = None,
        ticket: Ticket | None = None,
    ) -> list[Prepared]:
        """Make the claim's devices ready. `deadline` (time.monotonic) bounds the wait for the
        MIG writer lock; `ticket` (`inflight.prepare`, taken before `claim` was read) says
        whether an unprepare came since. Raises ConfigError (a bad claim), SliceInUse (a device
        overlaps a busy slice or another claim's), Superseded (an unprepare came since the
        ticket), LockHeld, NvmlError, MpsError, AgentError; whatever it raises, the claim holds
        nothing afterwards."""
        began = time.monotonic()
        kinds: list[str] = []  # the claim's kind once its devices are known (a refusal's too)
        try:
            with self._claim(ref.uid):
                if ticket is not None and ticket.unprepared:
                    raise Superseded(
                        f"{ref} was unprepared while this prepare read it (the claim was"
                        " deleted, or the kubelet let go of it): nothing was prepared; the"
                        " kubelet asks again if a pod still needs it"
                    )
                prepared = self._prepare(ref, claim, deadline, kinds)
        except AgentError as err:
            if self.stats is not None:
                self.stats.refused(reason_of(err))
                kind = kinds[0] if kinds else "gpu"  # refused before its devices were read
                self.stats.observe_prepare(kind, time.monotonic() - began, False)
            raise
        if self.stats is not None:
            self.stats.observe_prepare(kinds[0], time.monotonic() - began, True)
        return prepared

    def _prepare(
        self, ref: ClaimRef, claim: Mapping[str, Any], deadline: float | None, kinds: list[str]
    ) -> list[Prepared]:
        """The claim prepared; `kinds` gets its kind (mig | mps | gpu | admin) once its devices
        are known, whether it is prepared or refused."""
        c = self.config
        owners = self.owners.read()
        claims = owners.prepared_here(c.driver)
        before = self._finish_unprepare(ref.uid, claims.get(ref.uid), deadline)
        read = owners if before is claims.get(ref.uid) else None  # None: changed since
        if before is not None and before.state == PREPARED:
            gone = self._gone(ref.uid, before)
            if gone is None:
                kinds.append(kind_of(before.devices))
                return _answer(before)
            # A reboot (MIG slices, /var/run/cdi and MPS daemons do not survive one; the
            # checkpoint does), or someone destroyed it: made again, as NVIDIA's driver
            # drops a checkpoint of an earlier boot.
            log.warning("dra.prepare_again", claim=str(ref), gone=gone)
        try:
            claimed = claimed_devices(claim, c.driver, c.pool, c.share_sm_limit)
            if self.users is not None:
                claimed = self.users.resolve(claim, claimed, deadline)
            wanted = prepared_devices(self.fixed(), claimed, c.gpus)
        except AgentError:
            if before is not None:  # a retry that is refused now holds nothing
                self._release(ref.uid, before, deadline)
            raise
        entry = PreparedClaim(ref.namespace, ref.name, PREPARING, tuple(wanted), (), c.driver)
        try:
            done = self._run(ClaimChange(ref.uid, entry, deadline=deadline, read=read))
            entry = done.claim or entry  # as the engine recorded it: `existed` settled
            made = _made(done.inventory, list(entry.devices), ref)
            made = [self._start_mps(ref.uid, d, done.inventory) for d in made]
            ids = tuple(cdi.cdi_id(c.driver, ref.uid, d.device) for d in made)
            self._write_cdi(ref.uid, made)
            entry = replace(entry, state=PREPARED, devices=tuple(made), cdi_ids=ids)
            self._update(ref.uid, entry, deadline)
        except BaseException as err:
            kinds.append(kind_of(entry.devices))
            log.warning("dra.prepare_undone", claim=str(ref), error=str(err))
            try:
                if self._recorded(ref.uid):
                    self._release(ref.uid, entry, deadline)
            except AgentError as undo:  # the claim stays recorded: unprepare finishes it
                log.error("dra.undo_failed", claim=str(ref), error=str(undo))
            raise
        log.info("dra.prepared", claim=str(ref), devices=[d.device for d in made])
        kinds.append(kind_of(entry.devices))
        return _answer(entry)

    def _recorded(self, uid: str) -> bool:
        """Whether the record has the claim, read now (no lock: this claim's calls take turns).
        A prepare the engine refused before it recorded the claim made nothing (the record has
        a claim before its first NVML operation, and MPS daemons and CDI specs come after):
        its undo has nothing to release, so it neither waits for the locks nor reads the GPUs.
        A record that cannot be read says yes: the undo runs."""
        try:
            return uid in self.owners.read().claims
        except AgentError:
            return True

    # -- made before the pod binds (binding conditions) ----------------------------------------

    def make(
        self, ref: ClaimRef, claim: Mapping[str, Any], deadline: float | None = None
    ) -> list[PreparedDevice]:
        """The claim's MIG slices made before its pod binds (nodeagent.dra.k8s.binding): the first
        half of a prepare, through the same change (the ownership record first, then the
        planner's operations), leaving the claim `preparing` in the record with what it
        made, so that the kubelet's prepare finds the slices there and adopts them (created by
        the claim: its unprepare destroys them) and an unprepare undoes them. A claim already
        in the record is made again only where something is missing. Raises as prepare
        does; whatever it raises, the claim holds nothing afterwards."""
        with self._claim(ref.uid):
            c = self.config
            before = self._finish_unprepare(ref.uid, self.recorded().get(ref.uid), deadline)
            if (
                before is not None
                and before.state == PREPARED
                and self._gone(ref.uid, before) is None
            ):
                return list(before.devices)
            claimed = claimed_devices(claim, c.driver, c.pool, c.share_sm_limit)
            wanted = prepared_devices(self.fixed(), claimed, c.gpus)
            entry = PreparedClaim(ref.namespace, ref.name, PREPARING, tuple(wanted), (), c.driver)
            try:
                done = self._run(ClaimChange(ref.uid, entry, deadline=deadline))
                entry = done.claim or entry  # as the engine recorded it: `existed` settled
                made = _made(done.inventory, list(entry.devices), ref)
                self._update(ref.uid, replace(entry, devices=tuple(made)))
            except BaseException as err:
                log.warning("dra.make_undone", claim=str(ref), error=str(err))
                try:
                    self._release(ref.uid, entry, deadline)
                except AgentError as undo:
                    log.error("dra.undo_failed", claim=str(ref), error=str(undo))
                raise
        log.info("dra.made_before_binding", claim=str(ref), devices=[d.device for d in made])
        return made

    def waiting(self) -> dict[str, PreparedClaim]:
        """The claims the driver recorded that are not prepared (made before binding, or a
        prepare or an unprepare under way or cut short)."""
        return {u: c for u, c in self.recorded().items() if c.state != PREPARED}

    def _finish_unprepare(
        self, uid: str, claim: PreparedClaim | None, deadline: float | None
    ) -> PreparedClaim | None:
        """A claim whose unprepare was cut short after its slices went is unprepared to the
        end first (its CDI spec, its directories, its entry); returns the claim as it stands
        then (None: there is none)."""
        if claim is None or claim.state != UNPREPARING:
            return claim
        self._release(uid, claim, deadline)
        return None

    def _run(self, change: ClaimChange) -> ChangeDone:
        """The change through the engine; each NVML operation it made timed in the stats."""
        done = self.engine.run_change(change)
        if self.stats is not None:
            for op in done.operations:
                self.stats.observe_nvml(op.op.op.value, op.seconds)
        return done

    def _gone(self, uid: str, claim: PreparedClaim) -> str | None:
        """What of a prepared claim is no longer there (None: all of it is)."""
        if not cdi.spec_file(self.config.cdi_dir, self.config.driver, uid).exists():
            return "its CDI spec"
        gpus = {g.index: g for g in self.inventory().gpus}
        for d in claim.devices:
            if d.is_mig:
                gpu = gpus.get(d.gpu)
                s = slice_at(gpu, d.profile_id or 0, d.placement_start or 0) if gpu else None
                if s is None or s.mig_uuid != d.mig_uuid:
                    return f"the MIG device of {d.device}"
            if d.mps is not None and self._mps_pid(uid, d) is None:
                return f"the MPS daemon of {d.device}"
        return None

    def _mps_pid(self, uid: str, d: PreparedDevice) -> int | None:
        return self.daemons.pid(claim_device(uid, d))

    def _mates(self) -> Callable[[ShareKey], list[ClaimDevice]]:
        """The claims on a share server, as the ownership record has them when asked (the one
        record of which claims are its clients; one under way included)."""

        def on(key: ShareKey) -> list[ClaimDevice]:
            return [
                claim_device(uid, d)
                for uid, c in sorted(self.recorded().items())
                for d in c.devices
                if d.shared and d.mps is not None and share_key(d) == key
            ]

        return on

    def share_clients(
        self, claims: Mapping[str, PreparedClaim] | None = None
    ) -> dict[ShareKey, list[tuple[str, PreparedDevice]]]:
        """Every share server that should run, with its claims (prepared ones); `claims`: the
        driver's claims as read already (None: read now)."""
        out: dict[ShareKey, list[tuple[str, PreparedDevice]]] = {}
        for uid, c in sorted((claims if claims is not None else self.recorded()).items()):
            if c.state != PREPARED:
                continue
            for d in c.devices:
                if d.shared and d.mps is not None:
                    out.setdefault(share_key(d), []).append((uid, d))
        return out

    def prepared_claims(
        self, claims: Mapping[str, PreparedClaim] | None = None
    ) -> dict[str, tuple[str, str]]:
        """{UID: (namespace, name)} of the claims prepared here (of `claims`, as read already;
        None: read now)."""
        claims = claims if claims is not None else self.recorded()
        return {u: (c.namespace, c.name) for u, c in claims.items() if c.state == PREPARED}

    def check_shares(
        self, servers: Mapping[ShareKey, list[tuple[str, PreparedDevice]]] | None = None
    ) -> list[tuple[str, str]]:
        """Each share server that should run and does not (crashed, killed) started again
        with its ceiling; returns the (claim UID, device) of the claims it serves: their
        clients lost their server. The claims on other servers are not touched. `servers`:
        `share_clients` as the caller computed it this tick (None: from the record now), which
        servers to look at; the claims a stopped one serves are read from the record again,
        under its lock."""
        servers = servers if servers is not None else self.share_clients()
        return self.daemons.revive(servers, self._mates())  # the record as it is then

    def _start_mps(self, uid: str, d: PreparedDevice, inventory: Inventory) -> PreparedDevice:
        """The claim's daemon for `d` (a share: its device's one server, started by the
        first claim on it); its own limits go to its containers (nodeagent.dra.cdi)."""
        if d.mps is None:
            return d
        made = self.daemons.start(claim_device(uid, d), self._mates(), inventory)
        return replace(d, mps={**d.mps, **made})

    def mps_root(self, uid: str, device: str) -> Path:
        """The claim's own MPS daemon for one device: <plugin dir>/mps/<uid>/<device>/{pipe,log}."""
        return self.daemons.claim_dir(uid) / device

    def _write_cdi(self, uid: str, devices: list[PreparedDevice]) -> None:
        path = cdi.spec_file(self.config.cdi_dir, self.config.driver, uid)
        text = cdi.render_text(self.config.driver, uid, devices)
        try:
            atomic_write_text(path, text, mode=0o644)
        except OSError as err:
            raise AgentError(f"cannot write the CDI spec {path}: {err.strerror}") from err

    # -- unprepare ----------------------------------------------------------------------------

    def unprepare(self, uid: str, deadline: float | None = None) -> None:
        """Undo what the claim created: its MPS daemons and directories, the MIG slices it made
        (slices that were there before stay), its CDI spec, its records. Raises SliceInUse when
        a slice still has processes or a pod holds it (the kubelet asks again), NvmlError,
        MpsError, AgentError (a file that cannot be removed)."""
        began = time.monotonic()
        kind = "gpu"
        self.inflight.unprepared(uid)  # a prepare that read the claim before: refused
        try:
            with self._claim(uid):
                claim = self.owners.read().claims.get(uid)
                if claim is None or (claim.state and claim.driver != self.config.driver):
                    return  # unknown here, or another driver's
                if claim.state is None:  # known from its traces only: its entry goes
                    self._release(uid, PreparedClaim("", "", PREPARING), deadline)
                    return
                kind = kind_of(claim.devices)
                self._release(uid, claim, deadline)
        except AgentError as err:
            if self.stats is not None:
                self.stats.refused(reason_of(err))
                self.stats.observe_unprepare(kind, time.monotonic() - began, False)
            raise
        if self.stats is not None:
            self.stats.observe_unprepare(kind, time.monotonic() - began, True)
        log.info("dra.unprepared", claim=str(claim))

    def _rejoin(self, uid: str, left: list[PreparedDevice]) -> None:
        """A release that failed before the record let go of the claim (the MIG writer lock
        held past the kubelet's deadline, an NVML error): the share servers the claim left
        serve it again, with its limit in their ceiling, while the record has it (else a
        prepare of it, answered from the record, would find no server, and none would be
        started for it). Best effort: a failure is said, and the kubelet's retry goes on."""
        recorded = self.recorded().get(uid)
        if recorded is None or recorded.state != PREPARED:
            return  # a prepare's undo, or the slices gone already: nothing answers from it
        held = {d.device for d in recorded.devices}
        for d in left:
            if not d.shared or d.device not in held:
                continue
            try:
                self.daemons.start(claim_device(uid, d), self._mates(), self.fixed())
            except AgentError as err:
                log.warning("dra.share_not_rejoined", claim=str(recorded), error=str(err))

    def _release(self, uid: str, claim: PreparedClaim, deadline: float | None) -> None:
        """Undo what `claim` made, in the order that never leaves a slice unowned while it
        exists: MPS daemons, the slices (once they are gone, under the same lock, the engine
        records the claim `unpreparing`, holding nothing), the CDI spec (with an interrupted
        write of it), the MPS directories, the claim's entry."""
        c = self.config
        own = self.daemons.checked_claim_dir(uid)  # no link on the way: refused before anything
        left: list[PreparedDevice] = []
        try:
            for d in claim.devices:
                if d.mps is not None:
                    self.daemons.stop(claim_device(uid, d), self._mates())
                    left.append(d)
            self._run(ClaimChange(uid, claim, release=True, deadline=deadline))
        except BaseException:
            self._rejoin(uid, left)
            raise
        me = str(claim)
        spec = cdi.spec_file(c.cdi_dir, c.driver, uid)
        try:
            # The spec, and the temporary file of a write of it cut short by a kill: nothing
            # else knows that file is the claim's (its entry in the record goes last, below).
            spec = entry_of(c.cdi_dir, str(spec.relative_to(c.cdi_dir)), "the CDI spec")
            for path in (spec, *interrupted_writes(spec)):
                path.unlink(missing_ok=True)
            if own is not None:  # None: a link with nothing behind it, not followed
                shutil.rmtree(own)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise AgentError(
                f"cannot remove what {me} left ({err.filename}: {err.strerror}); the kubelet"
                " will ask again"
            ) from err
        self._update(uid, None, deadline)


def _left(deadline: float | None) -> float | None:
    """The seconds left until `deadline` (time.monotonic), for a wait for the record's lock
    (None: no deadline, the store's own wait)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _dropped(owners: Owners, uid: str, driver: str) -> Owners:
    """The record without the claim's entry: this driver's, or one known from traces only
    (never another driver's entry for the same claim UID)."""
    claim = owners.claims.get(uid)
    if claim is None or (claim.state is not None and claim.driver != driver):
        return owners
    return owners.without(uid)


def claim_device(uid: str, d: PreparedDevice) -> ClaimDevice:
    """A recorded MPS device as its daemon's owner takes it, its limits read once."""
    assert d.mps is not None
    uuid = d.mig_uuid if d.is_mig and d.mig_uuid else d.gpu_uuid
    return ClaimDevice(uid, d.device, d.gpu, uuid, d.is_mig, d.shared, ClaimLimits.of(d.mps))


def share_key(d: PreparedDevice) -> ShareKey:
    """The share server of a share device: the device its clients see, and their user."""
    return claim_device("", d).key


def _answer(claim: PreparedClaim) -> list[Prepared]:
    by_device = dict(zip((d.device for d in claim.devices), claim.cdi_ids, strict=False))
    return [
        Prepared(d.request, d.pool, d.device, (by_device[d.device],), device_data(d))
        for d in claim.devices
    ]


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


__all__ = ["NodeConfig", "NodeDriver", "Owners", "Prepared"]
