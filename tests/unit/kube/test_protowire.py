"""The protobuf wire reader and the pod-resources answer read with it, checked against the
protobuf runtime's own encoding of the kubelet's messages (nodeagent/kube/proto stubs)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.kube.podresources import gpu_holders
from nodeagent.kube.proto import podresources_pb2 as pb
from nodeagent.kube.protowire import WireError, fields
from nodeagent.snapshot import Holder


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", []),
        (b"\x08\x96\x01", [(1, 0, 150)]),  # the encoding guide's example
        (b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", [(1, 0, 2**64 - 1)]),  # int64 -1
        (b"\x12\x03abc", [(2, 2, b"abc")]),
        (b"\x1a\x00", [(3, 2, b"")]),
        (
            b"\x21" + struct.pack("<d", 1.5),
            [(4, 1, struct.unpack("<Q", struct.pack("<d", 1.5))[0])],
        ),
        (b"\x2d" + struct.pack("<I", 7), [(5, 5, 7)]),
        (b"\xf8\xff\xff\xff\x0f\x01", [(2**29 - 1, 0, 1)]),  # the largest field number
        (b"\x08\x01\x12\x01x\x08\x02", [(1, 0, 1), (2, 2, b"x"), (1, 0, 2)]),
    ],
)
def test_fields(data: bytes, expected: list[tuple[int, int, int | bytes]]) -> None:
    assert list(fields(data)) == expected


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x08", "a varint runs past the end"),
        (b"\x08\x80", "a varint runs past the end"),
        (b"\x08" + b"\x80" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x12\x05abc", "field 2 runs past the end"),
        (b"\x21\x00\x00", "field 4 runs past the end"),
        (b"\x2d\x00", "field 5 runs past the end"),
        (b"\x00\x01", "number 0"),
        (b"\x0b", "field 1 has wire type 3"),
        (b"\x0c", "field 1 has wire type 4"),
        (b"\x0e", "field 1 has wire type 6"),
    ],
)
def test_malformed_messages(data: bytes, error: str) -> None:
    with pytest.raises(WireError, match=error):
        list(fields(data))


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
resources = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/mig-1g.18gb", "nvidia.com/mig-3g.71gb", "example.com/nic", ""]
)
device_ids = st.lists(
    st.sampled_from([f"GPU-{i}" for i in range(6)] + ["MIG-a", "MIG-b"]), max_size=4
)
devices = st.builds(
    pb.ContainerDevices,
    resource_name=resources,
    device_ids=device_ids,
    topology=st.builds(
        pb.TopologyInfo,
        nodes=st.lists(st.builds(pb.NUMANode, ID=st.integers(-(2**63), 2**63 - 1)), max_size=2),
    ),
)
containers = st.builds(
    pb.ContainerResources,
    name=names,
    devices=st.lists(devices, max_size=3),
    cpu_ids=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
)
answers = st.builds(
    pb.ListPodResourcesResponse,
    pod_resources=st.lists(
        st.builds(
            pb.PodResources,
            name=names,
            namespace=names,
            containers=st.lists(containers, max_size=3),
        ),
        max_size=5,
    ),
)


@settings(max_examples=60, deadline=None)
@given(answers)
def test_gpu_holders_read_what_protobuf_wrote(answer: pb.ListPodResourcesResponse) -> None:
    """Every NVIDIA device of every container, first holder kept, as protobuf parses it."""
    expected: dict[str, Holder] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            for group in container.devices:
                if group.resource_name.startswith(("nvidia.com/gpu", "nvidia.com/mig-")):
                    for device_id in group.device_ids:
                        expected.setdefault(
                            device_id, Holder(pod.namespace, pod.name, container.name)
                        )
    assert gpu_holders(answer.SerializeToString()) == expected


def test_fields_a_newer_kubelet_adds_are_skipped() -> None:
    """A kubelet newer than the committed .proto adds fields to ContainerResources (memory = 4,
    a nested message; here also a fixed32 field 15, a wire type the .proto has nowhere): they
    are skipped, as protobuf skips them."""
    container = pb.ContainerResources(
        name="main",
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-0"])],
    ).SerializeToString()
    memory = b"\x0a\x06memory\x10\x80\x80\x80\x80\x10"  # ContainerMemory{memory_type, size}
    extra = b"\x22" + bytes([len(memory)]) + memory + b"\x7d\x01\x00\x00\x00"
    pod = pb.PodResources(name="p", namespace="n").SerializeToString()
    pod += b"\x1a" + bytes([len(container + extra)]) + container + extra
    reply = b"\x0a" + bytes([len(pod)]) + pod
    assert gpu_holders(reply) == {"GPU-0": Holder("n", "p", "main")}
    assert (
        pb.ListPodResourcesResponse.FromString(reply).pod_resources[0].containers[0].name == "main"
    )
