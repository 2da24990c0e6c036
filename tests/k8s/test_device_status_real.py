"""Device status against the real kube-apiserver and kube-scheduler (v1.36.2, the
DRAResourceClaimDeviceStatus and DRAResourceClaimGranularStatusAuthorization gates on): the
driver runs as a service account holding exactly the shipped ClusterRole
(daemonset/components/dra/rbac.yaml), with a token bound to a pod on its node as a DaemonSet's
pod has; claims the scheduler allocated are prepared through the fake kubelet and nodeagent's
plugin and end with status.devices naming what was made; unprepare removes them. Without the
role's new rules the API server refuses the write."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.agent.factory import dra_driver
from nodeagent.base.errors import KubeError
from nodeagent.dra.k8s.api import DraApi
from nodeagent.dra.k8s.server import KubeletPluginServer, Sockets
from nodeagent.dra.node import NodeConfig
from nodeagent.kube.api import KubeSettings, make_api_client
from nodeagent.metrics.dra import DraStats
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.settings import Settings
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.k8s.test_dra_real import _publish, _template
from tests.k8s.test_packing_real import DRIVER, REPO, _device_classes, _pod, _wait
from tests.support.dra import quit_mps
from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet
from tests.support.k8s import make_node

RBAC = REPO / "daemonset" / "components" / "dra" / "rbac.yaml"


def shipped_rules() -> list[dict[str, Any]]:
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def _without(resource: str) -> list[dict[str, Any]]:
    rules = [r for r in shipped_rules() if resource not in r["resources"]]
    assert len(rules) == len(shipped_rules()) - 1
    return rules


@contextmanager
def agent_identity(
    api: Any, namespace: str, node: str, rules: list[dict[str, Any]], where: Path
) -> Iterator[Path]:
    """A kubeconfig for a service account bound to a ClusterRole of `rules`, its token bound
    to a pod on `node` (as the kubelet mounts a DaemonSet pod's token); the cluster-wide
    role and binding are removed at the end."""
    from kubernetes import client

    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    name = f"nodeagent-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
    )
    try:
        pod = core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": name,
                    "containers": [{"name": "agent", "image": "nodeagent"}],
                },
            },
        )
        bound = {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod.metadata.uid}
        token = core.create_namespaced_service_account_token(
            name, namespace, {"spec": {"expirationSeconds": 3600, "boundObjectRef": bound}}
        ).status.token
        cfg = api.configuration
        with open(cfg.ssl_ca_cert) as ca:
            ca_text = ca.read()
        (where / "ca.crt").write_text(ca_text)
        kubeconfig = where / f"{name}.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {"server": cfg.host, "certificate-authority": "ca.crt"},
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": token}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        yield kubeconfig
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def _driver_api(kubeconfig: Path, node: str) -> DraApi:
    kube = KubeSettings(node_name=node, kubeconfig=str(kubeconfig), retry_seconds=2.0)
    return DraApi(make_api_client(kube), kube)


def _claim(api: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    raw = client.ResourceV1Api(api).read_namespaced_resource_claim(
        name, namespace, _preload_content=False
    )
    claim: dict[str, Any] = json.loads(raw.data)
    return claim


def _allocated(api: Any, namespace: str) -> list[dict[str, Any]]:
    from kubernetes import client

    raw = client.ResourceV1Api(api).list_namespaced_resource_claim(
        namespace, _preload_content=False
    )
    items = json.loads(raw.data)["items"]
    return [c for c in items if (c.get("status") or {}).get("allocation")]


def _one_gpu_claim(api: Any, namespace: str, node: str) -> dict[str, Any]:
    """Claim `c` of a whole GPU of an emulated H200 node `node`, allocated by the scheduler."""
    from kubernetes import client

    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    session = NvmlSession(SimulatedNvml(parse_spec("h200")))
    make_node(api, node)
    _publish(api, node, session)
    session.close()
    _device_classes(api)
    request = {"name": "g", "exactly": {"deviceClassName": DRIVER}}
    res.create_namespaced_resource_claim(
        namespace, {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [request]}}}
    )
    core.create_namespaced_pod(namespace, _pod("p", node, {"resourceClaimName": "c"}))
    claim: dict[str, Any] = _wait("claim c allocated", lambda: _allocated(api, namespace))[0]
    return claim


def test_claims_prepared_through_the_plugin_end_with_their_device_status(
    api_client: Any, namespace: str, short_tmp: Path, fake_mps_control: str
) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = f"n-{uuid.uuid4().hex[:8]}"
    state = short_tmp / "sim.json"
    session = NvmlSession(SimulatedNvml(parse_spec("h200x4"), state))
    make_node(api_client, node)
    _publish(api_client, node, session)
    _device_classes(api_client)
    for name in ("one-1g-slice", "whole-gpu", "mps-25"):
        res.create_namespaced_resource_claim_template(namespace, _template(name, namespace))
    for pod, template in {"asr": "one-1g-slice", "llm": "whole-gpu", "tts": "mps-25"}.items():
        core.create_namespaced_pod(
            namespace, _pod(pod, node, {"resourceClaimTemplateName": template})
        )
    claims = _wait(
        "3 claims allocated", lambda: (c := _allocated(api_client, namespace)) and len(c) == 3 and c
    )

    config = NodeConfig(
        DRIVER, node, short_tmp / "p", short_tmp / "cdi", mps_control=fake_mps_control
    )
    stats = DraStats()
    driver = dra_driver(
        session, Settings(), config, lambda i: None, state.with_name(".sim.json.lock"),
        stats=stats,
    )  # fmt: skip
    with agent_identity(api_client, namespace, node, shipped_rules(), short_tmp) as kubeconfig:
        sockets = Sockets(short_tmp / "p" / "dra.sock", short_tmp / "reg" / f"{DRIVER}-reg.sock")
        server = KubeletPluginServer(driver, _driver_api(kubeconfig, node), DRIVER, sockets)
        server.start()
        try:
            kubelet = FakeDraKubelet(short_tmp / "reg")
            kubelet.register(DRIVER)
            refs = [Claim(namespace, c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
            answers = kubelet.prepare(refs)
            assert all(a.error == "" for a in answers.values()), answers
            assert stats.status_writes == {"success": 3}

            inventory = read_inventory(session)
            kinds = {}
            for ref in refs:
                claim = _claim(api_client, namespace, ref.name)
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                (entry,) = claim["status"]["devices"]
                assert {k: entry[k] for k in ("driver", "pool", "device")} == {
                    k: result[k] for k in ("driver", "pool", "device")
                }
                (ready,) = entry["conditions"]
                assert (ready["type"], ready["status"], ready["reason"]) == (
                    "Ready", "True", "Prepared",
                )  # fmt: skip
                assert ready.get("observedGeneration") == claim["metadata"].get("generation")
                data = entry["data"]
                gpu = inventory.gpus[data["gpu"]["index"]]
                assert data["gpu"]["uuid"] == gpu.uuid
                kinds[data["type"]] = data
                if data["type"] == "mig":
                    (made,) = gpu.slices
                    assert data["uuid"] == made.mig_uuid
                    assert data["mig"]["profile"] == "1g.18gb"
                    assert data["mig"]["placement"] == {
                        "start": made.placement.start, "size": made.placement.size,
                    }  # fmt: skip
                    assert result["device"].endswith(f"-{made.placement.start}")
                else:
                    assert data["uuid"] == gpu.uuid
            assert sorted(kinds) == ["gpu", "mig", "mps"]
            assert kinds["mps"]["mps"] == {"threadPercentage": 25, "pinnedMemoryBytes": 16 << 30}

            assert kubelet.unprepare(refs) == {r.uid: "" for r in refs}
            for ref in refs:
                assert not _claim(api_client, namespace, ref.name)["status"].get("devices")
            assert stats.status_writes == {"success": 6}
        finally:
            server.stop()
            for d in (short_tmp / "p" / "mps").glob("*/*"):
                quit_mps(fake_mps_control, d)
            session.close()


@pytest.mark.parametrize(
    ("rules", "refused"),
    [
        pytest.param(shipped_rules(), None, id="the-shipped-role"),
        pytest.param(
            _without("resourceclaims/driver"),
            'HTTP 422 Unprocessable Entity: ResourceClaim.resource.k8s.io "c" is invalid:'
            " status.devices: Forbidden: changing status.devices requires"
            ' resource="resourceclaims/driver", verb="[associated-node:update arbitrary-node:update]"',
            id="without-resourceclaims/driver",
        ),
        pytest.param(
            _without("resourceclaims/status"),
            "HTTP 403 Forbidden",
            id="without-resourceclaims/status",
        ),
    ],
)
def test_the_status_write_takes_exactly_the_shipped_rules(
    api_client: Any, namespace: str, short_tmp: Path, rules: list[dict[str, Any]], refused: str
) -> None:

    node = f"n-{uuid.uuid4().hex[:8]}"
    claim = _one_gpu_claim(api_client, namespace, node)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    entry = {
        "driver": DRIVER, "pool": node, "device": result["device"], "data": {"uuid": "GPU-0"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }  # fmt: skip
    uid = claim["metadata"]["uid"]
    with agent_identity(api_client, namespace, node, rules, short_tmp) as kubeconfig:
        api = _driver_api(kubeconfig, node)
        if refused is None:
            assert api.update_claim_status(namespace, "c", uid, lambda c: [entry], 5.0)
            (stored,) = _claim(api_client, namespace, "c")["status"]["devices"]
            assert stored["data"] == {"uuid": "GPU-0"}
            assert api.update_claim_status(namespace, "c", uid, lambda c: [], 5.0)
            assert not _claim(api_client, namespace, "c")["status"].get("devices")
        else:
            with pytest.raises(KubeError) as err:
                api.update_claim_status(namespace, "c", uid, lambda c: [entry], 5.0)
            assert refused in str(err.value)
            assert not _claim(api_client, namespace, "c")["status"].get("devices")


def test_a_token_not_bound_to_the_claims_node_cannot_write_its_status(
    api_client: Any, namespace: str, short_tmp: Path
) -> None:
    """associated-node:update: the shipped role lets an agent write the status of claims on
    its own node only; the same service account's token bound to a pod on another node is
    refused."""

    node, other = f"n-{uuid.uuid4().hex[:8]}", f"n-{uuid.uuid4().hex[:8]}"
    make_node(api_client, other)
    claim = _one_gpu_claim(api_client, namespace, node)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    entry = {"driver": DRIVER, "pool": node, "device": result["device"], "data": {"uuid": "x"}}
    with agent_identity(api_client, namespace, other, shipped_rules(), short_tmp) as kubeconfig:
        api = _driver_api(kubeconfig, other)
        with pytest.raises(KubeError) as err:
            api.update_claim_status(
                namespace, "c", claim["metadata"]["uid"], lambda c: [entry], 5.0
            )
    # not on the claim's node: only arbitrary-node:update would do, and the role has none
    assert 'resource="resourceclaims/driver", verb="[arbitrary-node:update]"' in str(err.value)
    assert not _claim(api_client, namespace, "c")["status"].get("devices")


def test_a_write_from_a_stale_read_reads_the_claim_again(
    api_client: Any, namespace: str, short_tmp: Path
) -> None:
    """The claim changed since the prepare read it (the scheduler reserving it for another
    pod, a label): the update at the old resourceVersion conflicts, the claim is read again
    and the write made on it."""
    from kubernetes import client

    node = f"n-{uuid.uuid4().hex[:8]}"
    stale = _one_gpu_claim(api_client, namespace, node)
    client.ResourceV1Api(api_client).patch_namespaced_resource_claim(
        "c", namespace, {"metadata": {"labels": {"team": "speech"}}}
    )
    (result,) = stale["status"]["allocation"]["devices"]["results"]
    entry = {"driver": DRIVER, "pool": node, "device": result["device"], "data": {"uuid": "x"}}
    asked: list[str] = []

    def devices(claim: dict[str, Any]) -> list[dict[str, Any]]:
        asked.append(claim["metadata"]["resourceVersion"])
        return [entry]

    with agent_identity(api_client, namespace, node, shipped_rules(), short_tmp) as kubeconfig:
        api = _driver_api(kubeconfig, node)
        assert api.update_claim_status(
            namespace, "c", stale["metadata"]["uid"], devices, 5.0, stale
        )
    now = _claim(api_client, namespace, "c")
    assert now["metadata"]["labels"] == {"team": "speech"}  # the change in between is kept
    assert [e["data"] for e in now["status"]["devices"]] == [{"uuid": "x"}]
    assert len(asked) == 2 and asked[0] == stale["metadata"]["resourceVersion"] != asked[1]
