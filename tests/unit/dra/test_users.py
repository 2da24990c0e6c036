"""A share claim's user from its pods (nodeagent.dra.users), as pure functions: which
containers use the claim's device, and what uid they agree on."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.claims import ClaimedDevice, Mps
from nodeagent.dra.devices import parse_device_name
from nodeagent.dra.users import consumers, with_users

DEVICE = "gpu-0-mps"


def claimed(request: str = "gpu", user: int | None = None) -> ClaimedDevice:
    ref = parse_device_name(DEVICE)
    assert ref is not None
    return ClaimedDevice(request, "node-1", DEVICE, ref, Mps(30, 8 << 30, user), share_id="s")


def claim(reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if reserved is None:
        reserved = [{"resource": "pods", "name": "p", "uid": "pod-p"}]
    return {"metadata": {"namespace": "ns", "name": "c"}, "status": {"reservedFor": reserved}}


def c(name: str, user: Any = None, request: str | None = None, ref: str = "gpu") -> Any:
    entry: dict[str, Any] = {"name": ref}
    if request is not None:
        entry["request"] = request
    out: dict[str, Any] = {"name": name, "resources": {"claims": [entry]}}
    if user is not None:
        out["securityContext"] = {"runAsUser": user}
    return out


def pod(*containers: Any, user: Any = None, init: tuple[Any, ...] = (), uid: str = "pod-p") -> Any:
    spec: dict[str, Any] = {"containers": list(containers), "initContainers": list(init),
                            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}  # fmt: skip
    if user is not None:
        spec["securityContext"] = {"runAsUser": user}
    return {"metadata": {"namespace": "ns", "name": "p", "uid": uid}, "spec": spec}


def user_of(pods: list[Any], device: ClaimedDevice | None = None) -> int | None:
    (d,) = with_users(claim(), [device or claimed()], pods)
    assert d.mps is not None
    return d.mps.user


@pytest.mark.parametrize(
    ("pods", "device", "user"),
    [
        ([pod(c("a"))], claimed(), None),  # no runAsUser anywhere: the default
        ([pod(c("a"), user=0)], claimed(), None),  # uid 0: the default's record
        ([pod(c("a"), user=1000)], claimed(), 1000),  # the pod's
        ([pod(c("a", 2000), user=1000)], claimed(), 2000),  # the container's over the pod's
        ([pod(c("a", None), c("b", 1000), user=1000)], claimed(), 1000),
        ([pod(c("a", 1000), c("b", 3000, ref="other"))], claimed(), 1000),  # b: no such claim
        ([pod(c("a", 1000), c("b", 3000, request="tts"))], claimed(), 1000),  # b: another request
        ([pod(c("a", 1000, request="gpu"))], claimed("gpu/small"), 1000),  # a subrequest's
        ([pod(c("a"), init=(c("i", 1000),), user=1000)], claimed(), 1000),  # init containers too
        ([pod(c("a", 1000), uid="pod-other")], claimed(), None),  # not the reserved pod
        ([pod(c("a"))], claimed(user=1000), 1000),  # MpsShare's, the pods silent
        ([pod(c("a", 1000))], claimed(user=1000), 1000),  # MpsShare's, agreed
    ],
)
def test_the_share_user(pods: list[Any], device: ClaimedDevice, user: int | None) -> None:
    assert user_of(pods, device) == user


@pytest.mark.parametrize(
    ("pods", "device", "words"),
    [
        ([pod(c("a", 1000), c("b", 2000))], claimed(),
         "run as different users (container a of pod ns/p runs as 1000, container b of pod ns/p"
         " as 2000)"),
        ([pod(c("a", 1000), c("b", 2000), c("s"))], claimed(),
         "(container a of pod ns/p runs as 1000, container b of pod ns/p as 2000);"),
        ([pod(c("a", 1000), c("b"))], claimed(),
         "container a of pod ns/p runs as 1000 but container b of pod ns/p sets no runAsUser"),
        ([pod(c("a", 0))], claimed(user=1000),
         "its MpsShare config names user 1000 but container a of pod ns/p runs as 0"),
        ([pod(c("a", "1000"))], claimed(),
         "pod ns/p: spec.containers[0].securityContext.runAsUser is a string, not a whole number"),
        ([pod(c("a", 1000.0))], claimed(),
         "pod ns/p: spec.containers[0].securityContext.runAsUser is a number, not a whole number"),
        ([pod(c("a", -1))], claimed(),
         "pod ns/p: container a runs as user -1, not a uid (a whole number 0-2147483647)"),
        ([pod(c("a"), user=2**31)], claimed(),
         "pod ns/p: container a runs as user 2147483648, not a uid"),
        ([pod(c("a", 2**63))], claimed(), "container a runs as user 9223372036854775808, not a uid"),
        ([pod(c("a", 10**30))], claimed(user=1000), "runs as user 1000000000000000000000000000000,"),
    ],
)  # fmt: skip
def test_what_is_refused(pods: list[Any], device: ClaimedDevice, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        user_of(pods, device)
    assert words in str(err.value)
    assert str(err.value).startswith("claim ns/c: gpu-0-mps: ") or "pod ns/p" in str(err.value)


def test_only_pods_are_consumers() -> None:
    """A consumer of another resource (a controller reserving the claim) has no containers."""
    reserved = [{"apiGroup": "example.com", "resource": "pods", "name": "p", "uid": "pod-p"}]
    assert consumers(claim(reserved), [pod(c("a", 1000))]) == []
    assert consumers(claim(), [pod(c("a", 1000))])[0].user == 1000
