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

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nodeagent.base.logs import printable

PREPARING = "preparing"
PREPARED = "prepared"
UNPREPARING = "unpreparing"
STATES = (PREPARING, PREPARED, UNPREPARING)
UNKNOWN_GPU = -1  # a device of a version-1 ownership record, which named the GPU by UUID only


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
    return PreparedDevice(**raw)


def claim_of(raw: Any, devices: Any = device_of) -> PreparedClaim:
    """A claim as a record writes it; `devices` reads each device. Raises TypeError, KeyError,
    AttributeError, ValueError for a claim that is half understood (not trusted to say which
    slices it holds)."""
    raw = dict(raw)
    unknown = set(raw) - {"namespace", "name", "state", "devices", "cdi_ids", "driver"}
    if unknown:
        raise TypeError(f"unknown field {sorted(unknown)[0]!r}")
    held = tuple(devices(d) for d in raw.pop("devices"))
    cdi_ids = tuple(raw.pop("cdi_ids", ()))
    typed(raw, {"namespace": (str,), "name": (str,), "state": (str, type(None)), "driver": (str,)})
    state = raw.get("state")
    if state is not None and state not in STATES:
        raise TypeError(f"state is {state!r}")
    if not all(isinstance(i, str) for i in cdi_ids):
        raise TypeError(f"CDI ids {list(cdi_ids)!r}")
    driver = raw.get("driver", "")
    return PreparedClaim(raw["namespace"], raw["name"], state, held, cdi_ids, driver)
