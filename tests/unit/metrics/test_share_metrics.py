"""Each MPS share claim in /metrics (nodeagent.metrics.shares), on the emulator: its request and
limit always; the memory its clients use and the SMs they kept busy only where they can be
told (every client of its server placed on a claim; NVML putting SM use on the clients, not on
the server); and the share watch's HeldBelowRequest read off the same numbers."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.dra.cdi import CLAIM_ENV
from nodeagent.dra.watch import held_below, share_views
from nodeagent.metrics.dra import DraStats
from nodeagent.metrics.shares import ShareCollector, ShareUsage, ShareView
from nodeagent.nvml import NvmlSession, Placement, read_inventory
from nodeagent.nvml.codes import NOT_SUPPORTED
from nodeagent.nvml.write import MigWriter
from nodeagent.sim import Fault, FaultPlan, SimulatedNvml, parse_spec
from nodeagent.state.held import PreparedDevice
from nodeagent.state.sampling import UtilizationSampler
from nodeagent.state.snapshot import Store

MIB = 1 << 20
SERVER, ASR, TTS = 100, 101, 102


def view(claim: str, request: int, clients: tuple[int, ...] | None, **kw: object) -> ShareView:
    base = ShareView(
        claim, "speech", claim, "gpu-0-mps", 0, False, request, 100, request * 80 * MIB // 100,
        clients,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def scrape(
    loads: dict[int, float], views: list[ShareView], faults: FaultPlan | None = None
) -> CollectorRegistry:
    """An H100 running an MPS server and two clients at `loads`, sampled as the refresh worker
    does, the share watch's `views` published, and the collector registered."""
    lib = SimulatedNvml(parse_spec("h100-80gb"), faults=faults)
    lib.attach("0", SERVER, 66 * MIB, load=loads[SERVER])
    lib.attach("0", ASR, 4096 * MIB, load=loads[ASR], mps_client=True)
    lib.attach("0", TTS, 1024 * MIB, load=loads[TTS], mps_client=True)
    session = NvmlSession(lib)
    store = Store(session, time.time)
    snap = store.observe()
    UtilizationSampler(session, store).tick()
    stats = DraStats(lambda: store.utilization)
    stats.set_shares(views, snap.inventory)
    registry = CollectorRegistry()
    registry.register(ShareCollector(stats))
    return registry


def get(registry: CollectorRegistry, name: str, claim: str) -> float | None:
    labels = {"claim": claim, "namespace": "speech", "device": "gpu-0-mps"}
    return registry.get_sample_value(f"nodeagent_dra_share_{name}", labels)


def test_a_client_burst_is_attributed_to_its_claim_with_request_limit_and_memory() -> None:
    views = [view("asr", 30, (ASR,)), view("tts", 20, (TTS,), limit_percent=40)]
    registry = scrape({SERVER: 0.0, ASR: 0.6, TTS: 0.3}, views)
    assert {c: get(registry, "sm_request_percent", c) for c in ("asr", "tts")} == {
        "asr": 30, "tts": 20
    }  # fmt: skip
    assert {c: get(registry, "sm_limit_percent", c) for c in ("asr", "tts")} == {
        "asr": 100, "tts": 40
    }  # fmt: skip
    assert get(registry, "memory_request_bytes", "asr") == 24 * MIB
    assert get(registry, "memory_used_bytes", "asr") == 4096 * MIB
    assert get(registry, "memory_used_bytes", "tts") == 1024 * MIB
    assert get(registry, "sm_achieved_percent", "asr") == 60  # above its request: it burst
    assert get(registry, "sm_achieved_percent", "tts") == 30
    assert get(registry, "held_below_request", "asr") == 0


def test_a_driver_without_the_mps_list_still_gives_memory_from_the_compute_list() -> None:
    fault = Fault(function="nvmlDeviceGetMPSComputeRunningProcesses", error=NOT_SUPPORTED)
    views = [view("asr", 30, (ASR,)), view("tts", 20, (TTS,))]
    registry = scrape({SERVER: 0.0, ASR: 0.6, TTS: 0.3}, views, FaultPlan([fault]))
    assert get(registry, "memory_used_bytes", "asr") == 4096 * MIB
    assert get(registry, "sm_achieved_percent", "tts") == 30


def test_sm_use_on_the_server_is_no_claims_so_achieved_is_left_out() -> None:
    registry = scrape({SERVER: 0.9, ASR: 0.0, TTS: 0.0}, [view("asr", 30, (ASR,))])
    assert get(registry, "sm_achieved_percent", "asr") is None
    assert get(registry, "held_below_request", "asr") is None
    assert get(registry, "memory_used_bytes", "asr") == 4096 * MIB
    assert get(registry, "sm_request_percent", "asr") == 30


def test_a_client_that_names_no_claim_leaves_use_out_but_request_and_limit_in() -> None:
    registry = scrape({SERVER: 0.0, ASR: 0.5, TTS: 0.5}, [view("asr", 30, None)])
    assert get(registry, "sm_achieved_percent", "asr") is None
    assert get(registry, "memory_used_bytes", "asr") is None
    assert get(registry, "sm_limit_percent", "asr") == 100


def test_a_share_of_a_mig_device_has_memory_but_no_achieved() -> None:
    """NVML has no per-process utilization under MIG; the MIG device lists its MPS clients."""
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    writer = MigWriter(session)
    writer.set_mig_mode(0, True)
    gi = writer.create_gpu_instance(0, 19, Placement(3, 1))
    writer.create_compute_instance(0, gi, 1, 0, full=True)
    (uuid,) = [s.mig_uuid for s in read_inventory(session).gpus[0].slices]
    assert uuid is not None
    lib.attach(uuid, SERVER, 66 * MIB)
    lib.attach(uuid, ASR, 3072 * MIB, load=0.5, mps_client=True)
    store = Store(session, time.time)
    snap = store.observe()
    UtilizationSampler(session, store).tick()
    assert store.utilization.mps_clients == {0: {ASR: 3072 * MIB}}
    stats = DraStats(lambda: store.utilization)
    device = "gpu-0-mig-1g18gb-19-3-mps"
    stats.set_shares([view("asr", 30, (ASR,), mig=True, device=device)], snap.inventory)
    registry = CollectorRegistry()
    registry.register(ShareCollector(stats))
    labels = {"claim": "asr", "namespace": "speech", "device": device}
    assert registry.get_sample_value("nodeagent_dra_share_memory_used_bytes", labels) == 3 << 30
    assert registry.get_sample_value("nodeagent_dra_share_sm_achieved_percent", labels) is None
    assert registry.get_sample_value("nodeagent_dra_share_sm_request_percent", labels) == 30


def test_views_place_clients_by_their_claim_and_read_an_old_record_s_limit_as_its_request() -> None:
    def device(mps: dict[str, object]) -> PreparedDevice:
        return PreparedDevice("r", "node-1", "gpu-0-mps", 0, "GPU-0", mps=mps, shared=True)

    on = [
        ("uid-a", device({"thread_percentage": 30, "pinned_memory_bytes": 8 << 30})),
        ("uid-b", device({"thread_percentage": 20, "sm_limit_percent": 100, "priority": "low"})),
    ]
    env = {1: {CLAIM_ENV: "uid-a"}, 2: {CLAIM_ENV: "uid-b"}, 3: {CLAIM_ENV: "uid-a"}}
    claims = {"uid-a": ("speech", "asr"), "uid-b": ("speech", "emb")}
    a, b = share_views(on, [1, 2, 3, 4], env.get, claims, alive=lambda pid: False)  # 4: gone
    assert (a.name, a.request_percent, a.limit_percent, a.memory_request_bytes, a.clients) == (
        "asr", 30, 30, 8 << 30, (1, 3)
    )  # fmt: skip
    assert (b.name, b.limit_percent, b.clients) == ("emb", 100, (2,))
    # A client that runs but whose environment cannot be read, or one that names no claim:
    # any claim of the server may have started it.
    unread = share_views(on, [1, 2, 4], env.get, claims, alive=lambda pid: True)
    assert [v.clients for v in unread] == [None, None]
    env[4] = {}
    assert [v.clients for v in share_views(on, [1, 2, 4], env.get, claims)] == [None, None]


@pytest.mark.parametrize(
    ("asr", "tts", "below"),
    [
        (20.0, 75.0, {"asr"}),  # busy, 10 under its 30, while tts takes 75 of its 20
        (27.0, 70.0, set()),  # within one SM step of its request
        (0.0, 95.0, set()),  # idle: nothing held back
        (20.0, 60.0, set()),  # the GPU is not full: there were idle SMs to take
        (20.0, 20.0, set()),  # nobody over their request
    ],
)
def test_held_below_request(asr: float, tts: float, below: set[str]) -> None:
    usage = [
        ShareUsage(view("asr", 30, (ASR,)), None, asr),
        ShareUsage(view("tts", 20, (TTS,)), None, tts),
    ]
    found = held_below(usage)
    assert set(found) == below
    if below:
        assert found["asr"].startswith(
            "its clients got 20 % of the SMs, below its request of 30 %, while claim speech/tts"
            " took 75 % (request 20 %)"
        )


@pytest.mark.parametrize("wanted", [True, False])
def test_the_mps_clients_are_read_only_where_the_share_metrics_want_them(wanted: bool) -> None:
    """The agent reads them with --dra alone (an NVML call a device each refresh); the
    processes' samples are read either way."""
    lib = SimulatedNvml(parse_spec("h100-80gb"))
    lib.attach("0", SERVER, 66 * MIB, load=0.5)
    lib.attach("0", ASR, 4096 * MIB, load=0.4, mps_client=True)
    session = NvmlSession(lib)
    store = Store(session, time.time)
    store.observe()
    UtilizationSampler(session, store, mps_clients=wanted).tick()
    assert set(store.utilization.mps_clients.get(0, {})) == ({ASR} if wanted else set())
    assert store.utilization.by_gpu
