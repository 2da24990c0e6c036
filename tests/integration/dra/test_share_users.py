"""A share claim's user from its pods (issue 38 item 3; nodeagent.dra.users): the pods its
status.reservedFor names are read at prepare, and the effective runAsUser of the containers
that use the claim groups it with the claims of that user (one daemon per device and user).
Containers that disagree, or that contradict the claim's MpsShare user, are refused in one
sentence, and nothing is prepared for the claim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.dra import cdi
from tests.integration.dra.test_share_servers import env_of, servers, share
from tests.support.cluster import PODS
from tests.support.dra import DRIVER, NODE, DraNode
from tests.support.fake_kubelet.dra import Claim

kmock = pytest.importorskip("kmock")


def container(name: str, user: int | None = None, claim: str = "gpu") -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "example/voice",
                         "resources": {"claims": [{"name": claim}]}}  # fmt: skip
    if user is not None:
        c["securityContext"] = {"runAsUser": user}
    return c


def add_pod(
    node: DraNode,
    claim: dict[str, Any],
    name: str,
    containers: list[dict[str, Any]],
    pod_user: int | None = None,
    template: bool = False,
    node_name: str = NODE,
) -> None:
    """A pod using `claim` as its `gpu` (directly, or made from a template: named in its
    status), on `node_name`, reserved in the claim's status (as the scheduler leaves it)."""
    meta = claim["metadata"]
    pod_claim: dict[str, Any] = {"name": "gpu"}
    if template:
        pod_claim["resourceClaimTemplateName"] = "voice-share"
    else:
        pod_claim["resourceClaimName"] = meta["name"]
    spec: dict[str, Any] = {"nodeName": node_name, "containers": containers,
                            "resourceClaims": [pod_claim]}  # fmt: skip
    if pod_user is not None:
        spec["securityContext"] = {"runAsUser": pod_user}
    uid = f"pod-{name}"
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": meta["namespace"], "uid": uid},
                           "spec": spec}  # fmt: skip
    if template:
        pod["status"] = {"resourceClaimStatuses": [{"name": "gpu",
                                                    "resourceClaimName": meta["name"]}]}  # fmt: skip
    node.cluster.km.objects[PODS, meta["namespace"], name] = pod
    reserved = claim["status"].setdefault("reservedFor", [])
    reserved.append({"resource": "pods", "name": name, "uid": uid})


def mps_share(claim: dict[str, Any], user: int) -> dict[str, Any]:
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare", "user": user}}}
    ]  # fmt: skip
    return claim


def prepare(node: DraNode, *claims: dict[str, Any]) -> dict[str, str]:
    refs: list[Claim] = [node.add_claim(c) for c in claims]
    return {u: r.error for u, r in node.kubelet.prepare(refs).items()}


def nothing_of(node: DraNode, uid: str) -> bool:
    """The claim holds nothing: no CDI spec, no checkpoint entry."""
    spec = cdi.spec_file(node.cdi_dir, DRIVER, uid)
    return not spec.exists() and uid not in node.node.prepared_claims()


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_the_pods_run_as_user_puts_claims_on_the_daemon_of_that_user(dra_node: DraNode) -> None:
    """The pod's runAsUser, the container's over the pod's, a template's claim; a claim whose
    pods set none stays with uid 0."""
    asr = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, asr, "asr-0", [container("asr")], pod_user=1000)
    tts = share("tts", "uid-tts", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, tts, "tts-0", [container("tts", 1000)], pod_user=0, template=True)
    emb = share("emb", "uid-emb", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, emb, "emb-0", [container("emb")])
    assert prepare(dra_node, asr, tts, emb) == {"uid-asr": "", "uid-tts": "", "uid-emb": ""}
    assert names(servers(dra_node)) == ["gpu-0-mps-u0", "gpu-0-mps-u1000"]
    pipe = {c: env_of(dra_node, c)["CUDA_MPS_PIPE_DIRECTORY"] for c in ("uid-asr", "uid-tts")}
    assert pipe["uid-asr"] == pipe["uid-tts"]
    assert pipe["uid-asr"].endswith("/gpu-0-mps-u1000/pipe")
    assert env_of(dra_node, "uid-emb")["CUDA_MPS_PIPE_DIRECTORY"].endswith("/gpu-0-mps-u0/pipe")


def test_only_the_reserved_pods_containers_that_use_the_claim_count(dra_node: DraNode) -> None:
    """A sidecar without the claim, a pod of another node or not reserved, and a pod of the
    reserved name but another UID do not decide the user."""
    claim = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, claim, "asr-0", [container("asr", 2000), container("log", 3000, "other")])
    add_pod(dra_node, claim, "elsewhere", [container("asr", 4000)], node_name="node-2")
    dra_node.cluster.km.objects[PODS, "speech", "unreserved"] = {
        "metadata": {"name": "unreserved", "namespace": "speech", "uid": "pod-x"},
        "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": "asr"}],
                 "containers": [container("asr", 5000)]},
    }  # fmt: skip
    assert prepare(dra_node, claim) == {"uid-asr": ""}
    assert names(servers(dra_node)) == ["gpu-0-mps-u2000"]


def test_containers_of_different_users_are_refused_naming_them(dra_node: DraNode) -> None:
    claim = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, claim, "asr-0", [container("asr", 1000)])
    add_pod(dra_node, claim, "asr-1", [container("asr")], pod_user=2000)
    error = prepare(dra_node, claim)["uid-asr"]
    assert error == (
        "claim speech/asr: gpu-0-mps: the containers using it run as different users (container"
        " asr of pod speech/asr-0 runs as 1000, container asr of pod speech/asr-1 as 2000); the"
        " clients of one MPS server run as one user: give them one runAsUser, or split them"
        " into claims of their own"
    )
    assert servers(dra_node) == [] and nothing_of(dra_node, "uid-asr")


def test_a_container_without_runasuser_beside_one_with_is_refused(dra_node: DraNode) -> None:
    claim = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, claim, "asr-0", [container("asr", 1000), container("vad")])
    error = prepare(dra_node, claim)["uid-asr"]
    assert error.startswith(
        "claim speech/asr: gpu-0-mps: container asr of pod speech/asr-0 runs as 1000 but"
        " container vad of pod speech/asr-0 sets no runAsUser"
    )
    assert "MpsShare" in error
    assert servers(dra_node) == [] and nothing_of(dra_node, "uid-asr")


@pytest.mark.parametrize(
    ("pod_user", "error"),
    [
        (None, ""),  # the containers say nothing: the MpsShare user is taken
        (1000, ""),  # they agree
        (2000, "claim speech/asr: gpu-0-mps: its MpsShare config names user 1000 but container"
               " asr of pod speech/asr-0 runs as 2000; an MPS server runs as one user and a"
               " client of another waits behind it, so the MpsShare user and the containers'"
               " runAsUser must agree"),
    ],
)  # fmt: skip
def test_the_mpsshare_user_wins_where_the_pods_say_nothing_and_must_agree_where_they_do(
    dra_node: DraNode, pod_user: int | None, error: str
) -> None:
    claim = mps_share(share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi"), 1000)
    add_pod(dra_node, claim, "asr-0", [container("asr")], pod_user=pod_user)
    assert prepare(dra_node, claim) == {"uid-asr": error}
    assert names(servers(dra_node)) == ([] if error else ["gpu-0-mps-u1000"])
    if error:
        assert nothing_of(dra_node, "uid-asr")


def test_a_claim_whose_pods_cannot_be_listed_is_not_prepared_and_its_retry_is(
    dra_node: DraNode,
) -> None:
    """The API server refuses the pods' list (say, a role without it): the prepare fails with
    the API's sentence (the kubelet asks again), and the next try, once it answers, prepares."""
    claim = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, claim, "asr-0", [container("asr", 1000)])
    forbidden = kmock.KubernetesError(status=403, reason="Forbidden", message="no list")
    dra_node.cluster.on_loop(lambda: dra_node.cluster.km["list", PODS][0:1] << forbidden)
    error = prepare(dra_node, claim)["uid-asr"]
    assert "list pods in speech failed" in error and "403" in error, error
    assert nothing_of(dra_node, "uid-asr")
    assert prepare(dra_node, claim) == {"uid-asr": ""}
    assert names(servers(dra_node)) == ["gpu-0-mps-u1000"]
