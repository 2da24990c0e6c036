"""The README's DeviceClasses and `one-1g-slice` template, and nodeagent's device order,
against the real kube-scheduler (v1.36.2): 7 pods of the template land on one H200, each on its
own 1g.18gb placement, an 8th waits; 3g + 2g + 1g + 1g all fit on one H200, where the first fit
puts them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from nodeagent.dra.devices import resource_slices
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import parse_spec
from tests.support.k8s import create_device_classes, make_node
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.nodeagent.io"


def _wait(what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
    return wait_for(check, what, seconds, interval=0.2)


def _publish(api: Any, node: str, spec: str) -> None:
    """nodeagent's ResourceSlices of an emulated node, as the agent writes them."""
    from kubernetes import client

    res = client.ResourceV1Api(api)
    inventory = read_inventory(NvmlSession(SimulatedNvml(parse_spec(spec))))
    wanted = resource_slices(inventory, node, DRIVER)
    for s in wanted:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": s.name},
            "spec": {
                **s.spec,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(wanted)},
            },
        }
        res.create_resource_slice(body)


def _device_classes(api: Any) -> None:
    create_device_classes(api)


def _node(api: Any, spec: str) -> str:
    name = f"n-{uuid.uuid4().hex[:8]}"
    make_node(api, name)
    _publish(api, name, spec)
    _device_classes(api)
    return name


def _pod(name: str, node: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "g"}]},
                }
            ],
            "resourceClaims": [{"name": "g", **claim}],
        },
    }


def _allocated(res: Any, namespace: str, claim: str) -> str | None:
    c = res.read_namespaced_resource_claim(claim, namespace)
    if c.status is None or c.status.allocation is None:
        return None
    (result,) = c.status.allocation.devices.results
    return str(result.device)


def test_the_readme_template_gives_seven_pods_per_h200(api_client: Any, namespace: str) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = _node(api_client, "h200")
    docs = list(yaml.safe_load_all((REPO / "examples/dra/claim-templates.yaml").read_text()))
    (template,) = [d for d in docs if d["metadata"]["name"] == "one-1g-slice"]
    template["metadata"]["namespace"] = namespace
    res.create_namespaced_resource_claim_template(namespace, template)
    for i in range(8):
        core.create_namespaced_pod(
            namespace, _pod(f"asr-{i}", node, {"resourceClaimTemplateName": "one-1g-slice"})
        )

    def bound() -> list[Any]:
        pods = core.list_namespaced_pod(namespace).items
        return [p for p in pods if p.spec.node_name == node]

    _wait("7 pods bound", lambda: len(bound()) >= 7)
    time.sleep(2)  # the scheduler has tried the 8th meanwhile; it must stay pending
    pods = core.list_namespaced_pod(namespace).items
    assert len([p for p in pods if p.spec.node_name]) == 7
    claims = res.list_namespaced_resource_claim(namespace).items
    devices = sorted(
        r.device
        for c in claims
        if c.status and c.status.allocation
        for r in c.status.allocation.devices.results
    )
    assert devices == [f"gpu-0-mig-1g18gb-19-{i}" for i in range(7)]
    (pending,) = [p for p in pods if not p.spec.node_name]
    assert any(
        c.type == "PodScheduled" and c.status == "False" for c in pending.status.conditions or []
    )


def test_three_two_one_one_fit_where_the_first_fit_puts_them(
    api_client: Any, namespace: str
) -> None:
    from kubernetes import client

    core, res = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    node = _node(api_client, "h200")
    got = []
    for i, profile in enumerate(("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")):
        selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
        res.create_namespaced_resource_claim(
            namespace,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{i}"},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "r",
                                "exactly": {
                                    "deviceClassName": f"mig.{DRIVER}",
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ]
                    }
                },
            },
        )
        core.create_namespaced_pod(namespace, _pod(f"p{i}", node, {"resourceClaimName": f"c{i}"}))
        got.append(_wait(f"claim c{i} allocated", lambda i=i: _allocated(res, namespace, f"c{i}")))
    assert got == [
        "gpu-0-mig-3g71gb-9-4",
        "gpu-0-mig-2g35gb-14-2",
        "gpu-0-mig-1g18gb-19-1",
        "gpu-0-mig-1g18gb-19-0",
    ]
