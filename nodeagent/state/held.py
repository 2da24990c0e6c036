"""What a claim holds: one claim type and one device type for every record of it (the node's
ownership record, nodeagent.state.owners, the one authority; the DRA driver's checkpoint,
nodeagent.dra.checkpoint, its view), for the rebuild from the node's traces
(nodeagent.dra.traces), and for the driver's own plans.

A claim's state, as NVIDIA's DRA driver keeps it (PrepareStarted / PrepareCompleted,
cmd/gpu-kubelet-plugin/checkpoint.go), and one more: `preparing` (written before its first
mutation: what it will create), `prepared` (after: the MIG devices' ids, the CDI ids),
`unpreparing` (its slices are gone, its CDI spec and directories not yet), None (a claim the
record knows from the node's traces only, not from the driver: it holds its devices and
nothing more)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nodeagent.base.errors import shown
from nodeagent.base.logs import printable
from nodeagent.base.shapes import Shape, problem

PREPARING = "preparing"
PREPARED = "prepared"
UNPREPARING = "unpreparing"
STATES = (PREPARING, PREPARED, UNPREPARING)
UNKNOWN_GPU = -1  # a device of a version-1 ownership record, which named the GPU by UUID only
# A claim's UID as the kubelet's is checked (nodeagent.dra.claims): what the API server
# issues (an RFC 4122 UUID) and any short token of these characters (tests and other servers
# use them); never '/', '..' or a control character. A UID and a device name steer paths
# (<plugin>/mps/<uid>/<device>, the claim's CDI spec): a record's are read by this rule.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_USER = (1 << 31) - 1  # a share's clients' uid, as a pod's runAsUser
PRIORITIES = ("normal", "low")


@dataclass(frozen=True)
class PreparedDevice:
    """One device a claim holds, and what preparing it made: a whole GPU (no profile), or a
    MIG slice, by profile and placement, whether a slice was already there (`existed`:
    unprepare leaves it) and, once made, its GI, CI and MIG UUID. `shared`: an MPS share
    device, which the other claims sharing the same GPU or slice hold too. A device rebuilt
    from the node's traces knows where it is and little else (`request` and `pool` empty)."""

    request: str
    pool: str
    device: str
    gpu: int
    gpu_uuid: str
    profile_id: int | None = None
    profile: str | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    existed: bool = False
    gi_id: int | None = None
    ci_id: int | None = None
    mig_uuid: str | None = None
    mps: Mapping[str, Any] | None = None  # thread_percentage, pinned_memory_bytes, pipe_dir
    admin: bool = False  # adminAccess: holds nothing, made nothing
    shared: bool = False  # an MPS share device: other claims may hold the same device
    share_id: str | None = None  # the allocation's shareID (KEP-5075)

    @property
    def is_mig(self) -> bool:
        return self.profile_id is not None

    def overlaps(self, gpu: int, start: int, size: int) -> bool:
        """Whether it holds any memory slice of `size` slices from `start` on GPU `gpu` (a
        whole GPU holds them all; a device with admin access none)."""
        if gpu != self.gpu or self.admin:
            return False
        return self.overlaps_slices(start, size)

    def overlaps_slices(self, start: int, size: int) -> bool:
        """Whether it holds any of those memory slices of its own GPU."""
        if not self.is_mig:
            return True
        assert self.placement_start is not None and self.placement_size is not None
        return start < self.placement_start + self.placement_size and self.placement_start < (
            start + size
        )

    def same_share(self, other: PreparedDevice) -> bool:
        """Whether both are shares of one device (the GPU, or one profile at one placement)."""
        return (
            self.shared
            and other.shared
            and (self.gpu_uuid, self.placement_start, self.profile_id)
            == (other.gpu_uuid, other.placement_start, other.profile_id)
        )


@dataclass(frozen=True)
class PreparedClaim:
    """A claim of this node and what it holds (`state`: see the module); `driver`: the DRA
    driver that recorded it (one node may run more than one)."""

    namespace: str
    name: str
    state: str | None = None
    devices: tuple[PreparedDevice, ...] = ()
    cdi_ids: tuple[str, ...] = field(default_factory=tuple)
    driver: str = ""

    def __str__(self) -> str:
        return f"claim {printable(self.namespace)}/{printable(self.name)}"  # escaped, as Holder


def on_gpu(
    gpu: int,
    gpu_uuid: str,
    placement: tuple[int, int, int] | None = None,
    mig_uuid: str | None = None,
    *,
    device: str = "",
    shared: bool = False,
) -> PreparedDevice:
    """A device known by where it is: the GPU, or a slice at `placement` (start, size,
    profile id); the record's entry for a device found in the node's traces."""
    if placement is None:
        return PreparedDevice("", "", device, gpu, gpu_uuid, shared=shared)
    start, size, profile_id = placement
    return PreparedDevice(
        "", "", device, gpu, gpu_uuid, profile_id, None, start, size,
        mig_uuid=mig_uuid, shared=shared,
    )  # fmt: skip


_OPTIONAL_INT = ("profile_id", "placement_start", "placement_size", "gi_id", "ci_id")
_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("request", "pool", "device", "gpu_uuid"), (str,)),
    "gpu": (int,),
    **dict.fromkeys(_OPTIONAL_INT, (int, type(None))),
    **dict.fromkeys(("profile", "mig_uuid"), (str, type(None))),
    **dict.fromkeys(("existed", "admin", "shared"), (bool,)),
    "share_id": (str, type(None)),
    "mps": (dict, type(None)),
}
_NAMES = frozenset(f.name for f in fields(PreparedDevice))


def is_uid(value: object) -> bool:
    """Whether `value` is a claim UID by the kubelet's rule (see _TOKEN); a device name is
    held to the same rule."""
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None and ".." not in value


def typed(values: Mapping[str, Any], types: Mapping[str, tuple[type, ...]]) -> None:
    """Raise TypeError for a value of the wrong JSON type (a bool is no int here)."""
    for key, value in values.items():
        want = types.get(key)
        if want is not None and (
            not isinstance(value, want) or (isinstance(value, bool) and bool not in want)
        ):
            raise TypeError(f"{key} is {value!r}")


def device_of(raw: Any) -> PreparedDevice:
    """A device as a record writes it (its fields by name). Raises TypeError for a value of
    the wrong type, an unknown field or a missing one, AttributeError for no object."""
    typed(raw, _TYPES)
    unknown = set(raw) - _NAMES
    if unknown:
        raise TypeError(f"unknown field {sorted(unknown)[0]!r}")
    device = PreparedDevice(**raw)
    check_device(device)
    return device


def check_device(d: PreparedDevice) -> None:
    """Raise ValueError for a device whose fields break its invariants: a MIG device without
    its placement, a device name that is no name, an MPS share that is not one."""
    if d.device and not is_uid(d.device):  # the same safe token as a UID: it names files
        raise ValueError(f"device {shown(d.device)} is not a device name")
    if d.gpu < UNKNOWN_GPU:
        raise ValueError(f"device {d.device!r} is on GPU {d.gpu}")
    if d.is_mig and not (
        d.placement_start is not None
        and d.placement_start >= 0
        and d.placement_size is not None
        and d.placement_size >= 1
    ):
        raise ValueError(f"MIG device {d.device!r} has no placement (a start and a size)")
    if d.mps is not None:
        problem_ = _mps_problem(d.mps)
        if problem_ is not None:
            raise ValueError(f"device {d.device!r}: its mps {problem_}")


_MPS_SHAPE: dict[str, Shape] = {
    "thread_percentage": int, "pinned_memory_bytes": int, "user": int, "pipe_dir": str,
    "server": str, "sm_limit_percent": int, "priority": str,
}  # fmt: skip


def _mps_problem(mps: Mapping[str, Any]) -> str | None:
    """What is wrong with a device's `mps` (None: nothing): a thread percentage 1-100, its
    pinned memory bytes or null, its clients' uid; optional: an SM limit (a percentage no
    lower than the thread percentage), a priority, the pipe folder and the server."""
    found = problem(mps, _MPS_SHAPE)
    if found is not None:
        return f"{found[0]} {found[1]}"
    unknown = set(mps) - set(_MPS_SHAPE)
    if unknown:
        return f"has an unknown field {sorted(unknown)[0]!r}"
    threads = mps.get("thread_percentage")
    if threads is None:
        return "has no thread_percentage"
    if not 1 <= threads <= 100:
        return f"thread_percentage is {shown(threads)}, not a percentage from 1 to 100"
    limit = mps.get("sm_limit_percent")
    if limit is not None and not threads <= limit <= 100:
        return f"sm_limit_percent is {limit}, not from thread_percentage ({threads}) to 100"
    pinned = mps.get("pinned_memory_bytes")
    if pinned is not None and pinned < 0:
        return f"pinned_memory_bytes is {pinned}, not bytes"
    user = mps.get("user")
    if user is not None and not 0 <= user <= MAX_USER:
        return f"user is {user}, not a uid from 0 to {MAX_USER}"
    if mps.get("priority") not in (None, *PRIORITIES):
        return f"priority is {shown(mps['priority'])}, not one of {', '.join(PRIORITIES)}"
    if "\0" in str(mps.get("pipe_dir", "")):
        return "pipe_dir holds a NUL byte"
    return None


_CLAIM_SHAPE: dict[str, Shape] = {
    "namespace": str, "name": str, "state": str, "devices": [dict], "cdi_ids": [str],
    "driver": str,
}  # fmt: skip


def claim_of(raw: Any, devices: Any = device_of) -> PreparedClaim:
    """A claim as a record writes it; `devices` reads each device. Raises TypeError, KeyError,
    AttributeError, ValueError for a claim that is half understood (not trusted to say which
    slices it holds), each in our words."""
    found = problem(raw, _CLAIM_SHAPE)
    if found is not None:
        where, how = found
        raise TypeError(f"it {how}" if where == "the object" else f"its {where} {how}")
    raw = dict(raw)
    unknown = set(raw) - set(_CLAIM_SHAPE)
    if unknown:
        raise TypeError(f"unknown field {sorted(unknown)[0]!r}")
    if raw.get("devices") is None:
        raise TypeError("it has no devices")
    held = tuple(devices(d) for d in raw.pop("devices"))
    cdi_ids = tuple(raw.pop("cdi_ids", None) or ())
    typed(raw, {"namespace": (str,), "name": (str,), "state": (str, type(None)), "driver": (str,)})
    state = raw.get("state")
    if state is not None and state not in STATES:
        raise TypeError(f"state is {state!r}")
    if state == PREPARED and len(cdi_ids) != len(held):
        raise ValueError(
            f"it is prepared with {len(held)} devices and {len(cdi_ids)} CDI ids, not one per"
            " device"
        )
    driver = raw.get("driver", "")
    return PreparedClaim(raw["namespace"], raw["name"], state, held, cdi_ids, driver)
