"""Which user a share claim's clients run as, read from the pods that use it.

An MPS server runs as one uid, and a client of another waits behind it without a word, so the
share claims on a device are grouped by user (nodeagent.mps.servers.ShareKey): one daemon per
device and user. A claim's user is decided at prepare (docs/dra.md, "What a share claim
gets"):

- Its consumers are the pods that its `status.reservedFor` names (the scheduler writes it
  before the pod binds; pods reserved later are not read). Of each, the containers (init
  containers too) whose `resources.claims` name the claim, whole or the device's request, each
  running as its effective `runAsUser`: the container's `securityContext` over the pod's.
- An MpsShare config's `user` wins where the containers say nothing; a `runAsUser` that
  contradicts it is refused (that container would wait behind the server of its claim).
- Without one, the containers that set a `runAsUser` must all set the same, and none may set
  nothing beside them (it runs as its image's user, which the driver cannot know); that uid is
  the claim's user. No `runAsUser` anywhere: uid 0, the default.

Every refusal is a ConfigError in one sentence naming the pods, containers and uids; nothing
is prepared for the claim.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from nodeagent.base.errors import ConfigError
from nodeagent.base.logs import get_logger
from nodeagent.base.shapes import Shape, check
from nodeagent.dra.claims import MAX_UID, SHARE_KIND, ClaimedDevice, quoted

log = get_logger("nodeagent.dra")
API_SHARE = 0.5  # of the time left before the prepare's deadline, at most, for the pods' list

_CONTEXT: Shape = {"runAsUser": int}
_CONTAINER: Shape = {
    "name": str, "securityContext": _CONTEXT,
    "resources": {"claims": [{"name": str, "request": str}]},
}  # fmt: skip
_POD_CLAIM: Shape = {"name": str, "resourceClaimName": str}
POD: Shape = {
    "metadata": {"name": str, "namespace": str, "uid": str},
    "spec": {
        "securityContext": _CONTEXT, "resourceClaims": [_POD_CLAIM],
        "containers": [_CONTAINER], "initContainers": [_CONTAINER],
    },
    "status": {"resourceClaimStatuses": [_POD_CLAIM]},
}  # fmt: skip
RESERVED: Shape = {
    "metadata": {"name": str, "namespace": str},
    "status": {"reservedFor": [{"apiGroup": str, "resource": str, "name": str, "uid": str}]},
}


@dataclass(frozen=True)
class Consumer:
    """A container that uses the claim, and the uid it runs as (None: its image's user)."""

    pod: str  # namespace/name
    container: str
    request: str | None  # the claim's request it names; None: the whole claim
    user: int | None

    def __str__(self) -> str:
        return f"container {self.container} of pod {self.pod}"


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def reserved_pods(claim: Mapping[str, Any]) -> dict[str, str]:
    """{UID: name} of the pods the claim's status.reservedFor names. Raises Unreadable."""
    meta = _obj(claim.get("metadata"))
    check(claim, RESERVED, f"claim {meta.get('namespace')}/{meta.get('name')}")
    out = {}
    for r in (claim.get("status") or {}).get("reservedFor") or []:
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid"):
            out[str(r["uid"])] = str(r.get("name") or "")
    return out


def consumers(claim: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[Consumer]:
    """The containers of the claim's reserved pods (`pods`: any pods; the others are left
    out, as is a pod of the reserved name with another UID) that use the claim. Pure. Raises
    Unreadable (a ConfigError) naming a pod whose fields have the wrong JSON types."""
    meta = claim.get("metadata") or {}
    reserved = reserved_pods(claim)
    out: list[Consumer] = []
    for pod in pods:
        pm = _obj(pod.get("metadata"))
        uid = pm.get("uid")
        if not isinstance(uid, str) or uid not in reserved:
            continue
        if pm.get("namespace") != meta.get("namespace"):
            continue
        where = f"{pm.get('namespace')}/{pm.get('name')}"
        check(pod, POD, f"pod {where}")
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        names = {  # the pod's own names of this claim: direct, or made from a template
            c.get("name")
            for c in [*(spec.get("resourceClaims") or []),
                      *(status.get("resourceClaimStatuses") or [])]
            if c.get("resourceClaimName") == meta.get("name") and c.get("name")
        }  # fmt: skip
        pod_user = _obj(spec.get("securityContext")).get("runAsUser")
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            user = _obj(c.get("securityContext")).get("runAsUser")
            user = pod_user if user is None else user
            for entry in _obj(c.get("resources")).get("claims") or []:
                if entry.get("name") in names:
                    if user is not None and not 0 <= user <= MAX_UID:  # no uid: refused
                        raise ConfigError(
                            f"pod {where}: container {c.get('name')} runs as user {quoted(user)},"
                            f" not a uid (a whole number 0-{MAX_UID}); the kubelet could not"
                            " run it, and its MPS server could not run as it"
                        )
                    out.append(Consumer(where, str(c.get("name")), entry.get("request"), user))
    return out


def share_user(
    where: str, device: ClaimedDevice, given: int | None, users: list[Consumer]
) -> int | None:
    """The uid of the device's clients: `given` (the claim's MpsShare user) or the one
    runAsUser of its consumers (`users`, those using the device); None: no word of a user.
    Pure. Raises ConfigError when they contradict each other (module docstring)."""
    request = device.request.split("/", 1)[0]
    using = [u for u in users if u.request in (None, request, device.request)]
    declared = [u for u in using if u.user is not None]
    said = sorted({u.user for u in declared if u.user is not None})
    silent = [u for u in using if u.user is None]
    about = f"{where}: {device.device}"
    if given is not None:
        against = [u for u in declared if u.user != given]
        if against:
            raise ConfigError(
                f"{about}: its {SHARE_KIND} config names user {given} but {_runs(against)}; an"
                " MPS server runs as one user and a client of another waits behind it, so the"
                f" {SHARE_KIND} user and the containers' runAsUser must agree"
            )
        return given
    if len(said) > 1:
        raise ConfigError(
            f"{about}: the containers using it run as different users ({_runs(declared)}); the"
            " clients of one MPS server run as one user: give them one runAsUser, or split"
            " them into claims of their own"
        )
    if said and silent:
        raise ConfigError(
            f"{about}: {_runs(declared)} but {', '.join(dict.fromkeys(map(str, silent)))}"
            f" {'sets' if len(silent) == 1 else 'set'} no"
            " runAsUser (and runs as its image's user, unknown here); set runAsUser on every"
            f" container using the claim, or name the user in an {SHARE_KIND} config"
        )
    return said[0] if said else None


def _runs(users: list[Consumer]) -> str:
    """'container a of pod ns/p runs as 1000, container b of pod ns/q as 2000'."""
    pairs = dict.fromkeys((str(u), u.user) for u in users)  # a container named once
    return ", ".join(
        f"{who} {'runs ' if i == 0 else ''}as {uid}" for i, (who, uid) in enumerate(pairs)
    )


def with_users(
    claim: Mapping[str, Any], claimed: list[ClaimedDevice], pods: Iterable[Mapping[str, Any]]
) -> list[ClaimedDevice]:
    """`claimed` with each MPS share's user decided from its consumers among `pods`. Pure.
    Raises ConfigError (share_user; a pod that cannot be read)."""
    meta = claim.get("metadata") or {}
    where = f"claim {meta.get('namespace')}/{meta.get('name')}"
    users = consumers(claim, pods)
    out = []
    for d in claimed:
        if d.mps is None or not d.ref.shared or not users:
            out.append(d)
            continue
        user = share_user(where, d, d.mps.user, users)
        if user is not None and user != (d.mps.user or 0):  # uid 0 stays the default's record
            d = replace(d, mps=replace(d.mps, user=user))
        out.append(d)
    return out


class Pods(Protocol):
    """Where the pods come from (nodeagent.dra.k8s.api.DraApi)."""

    def pods_here(
        self, namespace: str, budget_seconds: float | None = None
    ) -> list[dict[str, Any]]: ...


class PodUsers:
    """A share claim's user from its pods' runAsUser, read at prepare (the hook of
    nodeagent.dra.node.NodeDriver). `clock`: time.monotonic, the prepare's deadline's."""

    def __init__(self, api: Pods, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock

    def resolve(
        self, claim: Mapping[str, Any], claimed: list[ClaimedDevice], deadline: float | None
    ) -> list[ClaimedDevice]:
        """`claimed` with its shares' users (with_users). No API call for a claim without an
        MPS share or without reserved pods. Raises ConfigError, KubeError (the pods could not
        be listed within half the time left before `deadline`: the kubelet asks again)."""
        if not any(d.mps is not None and d.ref.shared for d in claimed):
            return claimed
        if not reserved_pods(claim):
            return claimed
        meta = claim.get("metadata") or {}
        namespace = str(meta.get("namespace"))
        budget = None if deadline is None else max(0.1, (deadline - self.clock()) * API_SHARE)
        out = with_users(claim, claimed, self.api.pods_here(namespace, budget))
        changed = {d.device: d.mps.user for d in out if d.mps is not None and d not in claimed}
        if changed:
            log.info("dra.share_users", claim=f"{namespace}/{meta.get('name')}", users=changed)
        return out
