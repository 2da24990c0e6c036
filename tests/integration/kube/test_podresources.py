"""The kubelet pod-resources API: a real gRPC server on a unix socket serving recorded answers,
and an allocated slice treated as in use even with no process on it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nodeagent.base.errors import KubeError, SliceInUse
from nodeagent.kubelet.podresources import allocated_devices, pod_devices
from nodeagent.kubelet.proto import podresources_pb2 as pb
from nodeagent.kubelet.proto import podresources_pb2_grpc as pb_grpc
from nodeagent.mig.config import dump_config, parse_config
from nodeagent.mig.generate import generate_configs
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Holder
from tests.support.mig_apply import reconfigure

GPU = "GPU-1cc80f35-c91b-531f-a6bc-4db77760f20e"


def _answer(mig_uuid: str) -> pb.ListPodResourcesResponse:
    """As a kubelet answers: a MIG slice, a whole GPU shared by replicas, CPUs, no devices."""
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="asr-0",
                namespace="speech",
                containers=[
                    pb.ContainerResources(
                        name="server",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/mig-1g.18gb", device_ids=[mig_uuid]
                            )
                        ],
                        cpu_ids=[2, 3],
                    )
                ],
            ),
            pb.PodResources(
                name="embed-1",
                namespace="search",
                containers=[
                    pb.ContainerResources(
                        name="main",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=[f"{GPU}::1", f"{GPU}::3"],
                            ),
                            pb.ContainerDevices(
                                resource_name="example.com/nic", device_ids=["eth7"]
                            ),
                        ],
                    )
                ],
            ),
            pb.PodResources(
                name="web", namespace="default", containers=[pb.ContainerResources(name="nginx")]
            ),
        ]
    )


class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.answer = pb.ListPodResourcesResponse()

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        return self.answer


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, Path]]:
    socket = tmp_path / "kubelet.sock"
    service = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    yield service, socket
    server.stop(0)


def test_pod_devices_name_the_container_of_every_device_and_replica(
    kubelet: tuple[Kubelet, Path],
) -> None:
    service, socket = kubelet
    service.answer = _answer("MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757")
    assert pod_devices(socket) == {
        "MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757": Holder("speech", "asr-0", "server"),
        f"{GPU}::1": Holder("search", "embed-1", "main"),
        f"{GPU}::3": Holder("search", "embed-1", "main"),
    }


def test_allocated_devices(kubelet: tuple[Kubelet, Path]) -> None:
    service, socket = kubelet
    service.answer = _answer("MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757")
    assert allocated_devices(socket) == {
        "MIG-45461d2e-e081-5cfb-abad-bf4fcdc28757": "pod speech/asr-0",
        GPU: "pod search/embed-1",
    }


def test_unreachable_kubelet_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KubeError, match="does not exist"):
        allocated_devices(tmp_path / "nope.sock")
    (tmp_path / "dead.sock").touch()
    with pytest.raises(KubeError, match="List on"):
        allocated_devices(tmp_path / "dead.sock", timeout_seconds=1)


def test_a_slice_held_by_a_pod_is_never_destroyed(kubelet: tuple[Kubelet, Path]) -> None:
    service, socket = kubelet
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "g")
    reconfigure(session, cfg, "all-balanced", lib.reset)
    held = next(s for s in read_inventory(session).gpus[0].slices if s.profile == "3g.71gb")
    assert held.mig_uuid and not held.processes  # allocated, no process yet
    service.answer = _answer(held.mig_uuid)
    with pytest.raises(SliceInUse, match="in use by pod speech/asr-0"):
        reconfigure(session, cfg, "all-1g.18gb", lib.reset, in_use=allocated_devices(socket))
    assert held.mig_uuid in {s.mig_uuid for s in read_inventory(session).gpus[0].slices}


def test_metrics_count_a_pod_allocated_slice_as_used(kubelet: tuple[Kubelet, Path]) -> None:
    from prometheus_client import generate_latest

    from tests.support.agent import make_agent

    service, socket = kubelet
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    cfg = parse_config(dump_config(generate_configs(read_inventory(session))), "g")
    reconfigure(session, cfg, "all-balanced", lib.reset)
    held = next(s for s in read_inventory(session).gpus[0].slices if s.profile == "3g.71gb")
    assert held.mig_uuid
    service.answer = _answer(held.mig_uuid)
    agent = make_agent(session, lib.reset, allocations=lambda: pod_devices(socket))
    agent.refresh()
    text = generate_latest(agent.registry).decode()
    assert 'nodeagent_gpu_slices{gpu="0",profile="3g.71gb",state="used"} 1.0' in text
    assert 'nodeagent_gpu_slices{gpu="0",profile="1g.18gb",state="free"} 2.0' in text


def test_no_mig_change_while_the_kubelet_cannot_be_asked(tmp_path: Path) -> None:
    """README: "If the kubelet cannot be asked, the change fails rather than guess" — whether it
    never answered or answered before (its last answer may be stale)."""
    from tests.support.agent import make_agent
    from tests.support.fake_kubelet.podresources import serve

    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    mig = tmp_path / "mig.yaml"
    mig.write_text(dump_config(generate_configs(read_inventory(session))))
    socket = tmp_path / "kubelet.sock"

    def layout() -> list[str]:
        return sorted(s.profile for s in read_inventory(session).gpus[0].slices)

    with serve(socket) as kubelet:
        kubelet.error = grpc.StatusCode.UNAVAILABLE
        agent = make_agent(
            session,
            lib.reset,
            allocations=lambda: pod_devices(socket),
            mig={"config_file": str(mig), "config": "all-balanced"},
        )
        agent.reconcile()
        report = agent.pipeline.last_report
        assert report is not None and report.result == "failure"
        assert report.reason.startswith("plan: cannot tell which slices pods hold (kubelet")
        assert "UNAVAILABLE" in report.reason and layout() == []  # nothing was changed
        kubelet.error = None
        agent.reconcile()
        assert agent.pipeline.last_report.result == "success"  # type: ignore[union-attr]
        assert layout() == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]
        kubelet.error = grpc.StatusCode.UNAVAILABLE  # it answered once; still no guessing
        agent.settings = dataclasses.replace(
            agent.settings, mig=dataclasses.replace(agent.settings.mig, config="all-7g.141gb")
        )
        agent.reconcile()
        report = agent.pipeline.last_report
        assert report is not None and report.result == "failure"
        assert "cannot tell which slices pods hold" in report.reason
        assert layout() == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]
        agent.stop()


def test_one_grpc_stack_asks_the_kubelet(tmp_path: Path) -> None:
    """The pod-resources client is grpcio, as the DRA plugin: no second HTTP/2 stack (h2) is
    loaded to ask the kubelet."""
    import subprocess
    import sys

    from tests.support.fake_kubelet.podresources import pod, serve

    socket = tmp_path / "kubelet.sock"
    script = (
        "import sys; from pathlib import Path;"
        "from nodeagent.kubelet.podresources import pod_devices;"
        f"print(*pod_devices(Path({str(socket)!r})));"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'h2', 'hpack'}))"
    )
    with serve(socket) as kubelet:
        kubelet.pods = [pod("speech", "asr-0", {"server": {"nvidia.com/gpu": [GPU]}})]
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    assert out == [GPU, "['grpc']"]
