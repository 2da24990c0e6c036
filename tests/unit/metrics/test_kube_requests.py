"""Every request to the API server is counted by verb, resource and status, as the API
server's audit log would name them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.metrics.kube import KubeCollector, KubeRequests, SkippedObjects, resource_of, verb_of


@pytest.mark.parametrize(
    ("method", "path", "watch", "verb", "resource"),
    [
        ("GET", "/api/v1/nodes/gpu-1", False, "get", "nodes"),
        ("GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dgpu-1", True, "watch", "nodes"),
        ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1", False, "list", "pods"),
        ("PATCH", "/api/v1/nodes/gpu-1", False, "patch", "nodes"),
        ("POST", "/api/v1/namespaces/default/events", False, "create", "events"),
        ("GET", "/api/v1/namespaces/ml/pods/asr-0", False, "get", "pods"),
        ("DELETE", "/api/v1/namespaces/ml/pods/asr-0", False, "delete", "pods"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices", False, "list", "resourceslices"),
        ("PUT", "/apis/resource.k8s.io/v1/resourceslices/s-1", False, "update", "resourceslices"),
        (
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c",
            False,
            "get",
            "resourceclaims",
        ),
        (
            "GET",
            "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/n/nodefeatures",
            False,
            "list",
            "nodefeatures",
        ),
    ],
)
def test_verbs_and_resources(method: str, path: str, watch: bool, verb: str, resource: str) -> None:
    assert (verb_of(method, path, watch), resource_of(path)) == (verb, resource)


def test_counted_and_exported() -> None:
    requests = KubeRequests()
    requests.add("GET", "/api/v1/nodes/gpu-1", False, "200")
    requests.add("GET", "/api/v1/nodes/gpu-1", False, "200")
    requests.add("PATCH", "/api/v1/nodes/gpu-1", False, "error")
    family, _, _ = KubeCollector(requests, SkippedObjects()).collect()
    samples = {
        tuple(s.labels.values()): s.value for s in family.samples if s.name.endswith("_total")
    }
    assert samples == {("get", "nodes", "200"): 2.0, ("patch", "nodes", "error"): 1.0}


def test_an_unreadable_object_is_counted_once_and_named_while_it_stays_so() -> None:
    skipped = SkippedObjects()
    key = ("resourceclaims", "speech", "bad")
    assert skipped.skipped(key, "status.allocation.devices")
    assert not skipped.skipped(key, "status.allocation.devices")  # listed again: said once
    assert skipped.skipped(("resourceclaims", "", "odd"), "metadata")
    registry = CollectorRegistry()
    registry.register(KubeCollector(KubeRequests(), skipped))
    counted = {"resource": "resourceclaims", "field": "status.allocation.devices"}
    assert registry.get_sample_value("nodeagent_kube_objects_skipped_total", counted) == 1.0
    named = {"resource": "resourceclaims", "namespace": "speech", "name": "bad"}
    gauge = "nodeagent_kube_object_unreadable"
    assert registry.get_sample_value(gauge, {**named, "field": "status.allocation.devices"}) == 1
    assert skipped.readable(key)  # fixed: no longer named, still counted
    assert skipped.listed("resourceclaims", set()) == [("resourceclaims", "", "odd")]
    assert registry.get_sample_value(gauge, {**named, "field": "status.allocation.devices"}) is None
    assert registry.get_sample_value("nodeagent_kube_objects_skipped_total", counted) == 1.0
