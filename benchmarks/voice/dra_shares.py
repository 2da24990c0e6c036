"""The voice study's DRA modes: the models as the clients of MPS share claims that nodeagent's own
DRA driver prepared (issue 38).

`prepared_shares()` runs the driver's node side as the agent does (nodeagent.dra.k8s.server's
kubelet plugin over the driver of nodeagent.agent.factory.dra_driver), with kmock as the API
server that holds the ResourceClaims (the real kube-apiserver does not travel to the GPU
machine) and the tests' fake kubelet (tests/support/fake_kubelet/dra.py), which registers the
plugin and calls NodePrepareResources for one share claim per model, each allocated as the
scheduler leaves it: device `gpu-0-mps` (the GPU's MPS share device, nodeagent.dra.capacity), a
shareID of its own, and a consumedCapacity of `<driver>/sm` percent and `<driver>/memory`. Then
each claim's CDI spec, as the driver wrote it, is read back: its env entries become the model
process's environment on top of the harness's (without any CUDA_MPS_* of its own), and its
mounts are checked: a process outside a container gets no bind mount, so a mount is only
accepted where hostPath == containerPath (true of the pipe directory the driver mounts: the
same path inside and out), and is recorded as skipped. The claims are unprepared on the way out.

On the GPU machine the NVML is the real one and the control program the real
nvidia-cuda-mps-control; `simulate=` runs the same path on the emulator (nodeagent.sim) with
the tests' fake MPS daemon (tests/support/fake_mps), on any machine.

`per_claim_daemons()` is the design before issue 38 (a control daemon per claim, each with its
claim's limits as its defaults: what nodeagent.dra.node started for each share claim): three of
nodeagent's MpsDaemon, one per model, the clients' environment shaped as such a claim's CDI
spec was (its own pipe directory, its limits).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DRIVER = "gpu.nodeagent.io"
NODE = "voice-node"
NAMESPACE = "voice"
SHARE_DEVICE = "gpu-0-mps"  # GPU 0's MPS share device
PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"


CONFIG_API_VERSION = "gpu.nodeagent.io/v1"
SHARE_KIND = "MpsShare"


@dataclass(frozen=True)
class Share:
    """One model's share claim: percent of the GPU's SMs and bytes of its memory (its
    request, what the scheduler counts), and the parameters of its MpsShare config (`user`,
    `smLimit`, `priority`), if any."""

    model: str
    sm_percent: int
    memory: str  # a Kubernetes quantity, as the scheduler writes it ("16Gi")
    config: dict[str, Any] = field(default_factory=dict)  # MpsShare parameters: none, no config

    def parameters(self) -> dict[str, Any] | None:
        """The claim's opaque MpsShare config as the driver reads it; None for none."""
        if not self.config:
            return None
        return {"apiVersion": CONFIG_API_VERSION, "kind": SHARE_KIND, **self.config}


@dataclass(frozen=True)
class ClientEnv:
    """What a claim's CDI spec gives its containers: the env entries and the mounts."""

    model: str
    claim_uid: str
    cdi_id: str
    spec_file: str
    env: dict[str, str]
    mounts: list[dict[str, Any]]
    skipped_mounts: list[str] = field(default_factory=list)

    @property
    def pipe_dir(self) -> str | None:
        return self.env.get(PIPE_ENV)

    def limits(self) -> dict[str, Any]:
        """The limits the spec asks for: thread percentage, pinned memory (as the env says)."""
        return {"thread_percentage": self.env.get(PCT_ENV), "pinned_memory": self.env.get(MEM_ENV)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "claim_uid": self.claim_uid,
            "cdi_id": self.cdi_id,
            "spec_file": self.spec_file,
            "env": self.env,
            "mounts": self.mounts,
            "skipped_mounts": self.skipped_mounts,
        }


def share_claim(name: str, uid: str, share: Share, device: str = SHARE_DEVICE) -> dict[str, Any]:
    """A ResourceClaim of one MPS share as the scheduler leaves it allocated (KEP-5075)."""
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {
            f"{DRIVER}/sm": str(share.sm_percent),
            f"{DRIVER}/memory": share.memory,
        },
    }
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": DRIVER,
            "capacity": {
                "requests": {
                    f"{DRIVER}/sm": str(share.sm_percent),
                    f"{DRIVER}/memory": share.memory,
                }
            },
        },
    }
    params = share.parameters()
    config = (
        [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": params},
            }
        ]
        if params
        else []
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {
            "devices": {
                "requests": [request],
                **(
                    {"config": [{k: v for k, v in c.items() if k != "source"} for c in config]}
                    if config
                    else {}
                ),
            }
        },
        "status": {"allocation": {"devices": {"results": [result], "config": config}}},
    }


def read_cdi(cdi_dir: Path, cdi_id: str) -> tuple[Path, dict[str, Any]]:
    """The spec file in `cdi_dir` whose kind and device make `cdi_id` (`<kind>=<device>`), and
    that device's containerEdits. Raises SystemExit naming what is missing."""
    kind, _, name = cdi_id.partition("=")
    for path in sorted(cdi_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        if spec.get("kind") != kind:
            continue
        for device in spec.get("devices") or []:
            if device.get("name") == name:
                edits = dict(spec.get("containerEdits") or {})
                for key, value in (device.get("containerEdits") or {}).items():
                    edits[key] = [*edits.get(key, []), *value]
                return path, edits
    raise SystemExit(f"voice benchmark: no CDI spec in {cdi_dir} has the device {cdi_id}")


def client_env(model: str, claim_uid: str, cdi_id: str, cdi_dir: Path) -> ClientEnv:
    """The environment and mounts a container of the claim gets from its CDI spec. Raises
    SystemExit for a mount a process outside a container cannot have (hostPath !=
    containerPath) or an env entry that is not NAME=VALUE."""
    path, edits = read_cdi(cdi_dir, cdi_id)
    env: dict[str, str] = {}
    for entry in edits.get("env") or []:
        name, sep, value = str(entry).partition("=")
        if not sep or not name:
            raise SystemExit(f"voice benchmark: {path}: env entry {entry!r} is not NAME=VALUE")
        env[name] = value
    mounts = list(edits.get("mounts") or [])
    skipped = []
    for m in mounts:
        host, inside = m.get("hostPath"), m.get("containerPath")
        if host != inside:
            raise SystemExit(
                f"voice benchmark: {path} mounts {host} at {inside}; without a container a"
                " model process can only have mounts whose host and container paths are equal"
            )
        skipped.append(str(host))  # the same path inside and out: nothing to bind
    if edits.get("deviceNodes") or edits.get("hooks"):
        raise SystemExit(f"voice benchmark: {path} has device nodes or hooks: not applied here")
    return ClientEnv(model, claim_uid, cdi_id, str(path), env, mounts, skipped)


def model_env(base: Mapping[str, str], client: ClientEnv) -> dict[str, str]:
    """A model process's whole environment: the harness's without MPS variables of its own,
    then exactly the spec's env entries."""
    clean = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    return {**clean, **client.env}


def control_program(simulate: str | None, root: Path) -> str:
    if simulate:
        from tests.support.fake_mps.script import control_script

        return str(control_script(root / "fake"))
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        raise SystemExit(
            "nvidia-cuda-mps-control is not on PATH: the MPS and DRA share modes need it"
        )
    return binary


def nvml_session(simulate: str | None, root: Path) -> Any:
    """The real NVML's session (the process's one: open_session) or an emulated node's own
    under `root`. Give it back with release_session."""
    from nodeagent.nvml import NvmlSession, load_real_library, open_session

    if not simulate:
        return open_session(load_real_library())
    from nodeagent.sim import SimulatedNvml
    from nodeagent.sim.models import parse_spec

    return NvmlSession(SimulatedNvml(parse_spec(simulate), root / "sim.json"))


def release_session(session: Any, simulate: str | None) -> None:
    """Close an emulated node's session; the real one is the process's, shared by every user
    of NVML in it (the study's GPU counters, the other modes' drivers), so it stays open
    until the process exits."""
    if simulate:
        session.close()


def _no_reset(index: int) -> None:
    raise SystemExit(f"voice benchmark: the DRA driver asked for a reset of GPU {index}")


def _quit_daemons(control: str, plugin_dir: Path) -> None:
    """Quit any MPS control daemon left under the plugin directory (an unprepare that failed)."""
    from tests.support.dra import quit_mps

    for pidfile in plugin_dir.glob("mps/**/nvidia-cuda-mps-control.pid"):
        quit_mps(control, pidfile.parent.parent)


@dataclass
class PreparedShares:
    clients: list[ClientEnv]
    prepare_seconds: float
    control: str
    root: Path
    info: dict[str, Any] = field(default_factory=dict)

    def daemons(self) -> int:
        """How many MPS control daemons the clients use (their distinct pipe directories)."""
        return len({c.pipe_dir for c in self.clients if c.pipe_dir})

    def summary(self) -> dict[str, Any]:
        return {
            **self.info,
            "prepare_seconds": self.prepare_seconds,
            "daemons": self.daemons(),
            "claims": [c.to_dict() for c in self.clients],
            "client_thread_percentage": {c.model: c.env.get(PCT_ENV) for c in self.clients},
        }


@contextlib.contextmanager
def prepared_shares(
    shares: Sequence[Share],
    root: Path,
    simulate: str | None = None,
    settings_file: str | None = None,
) -> Iterator[PreparedShares]:
    """One share claim per model prepared by nodeagent's DRA kubelet plugin through the fake
    kubelet, unprepared on the way out. `settings_file`: nodeagent settings (its own file
    format) for the driver; default: the defaults. Raises SystemExit (one sentence) when a
    claim is refused."""
    try:
        import kmock  # noqa: F401
    except ImportError:
        raise SystemExit(
            "voice benchmark: the DRA modes need kmock (the API server of the claims) and the"
            " kubernetes client: pip install kmock, or carry the wheels of"
            " benchmarks/voice/wheels.sh"
        ) from None
    from nodeagent.agent.factory import dra_driver
    from nodeagent.dra.k8s.api import DraApi
    from nodeagent.dra.k8s.server import KubeletPluginServer, Sockets
    from nodeagent.dra.node import NodeConfig
    from nodeagent.kube.api import KubeSettings, make_api_client
    from nodeagent.settings import Settings
    from tests.support.dra import CLAIMS, dra_cluster
    from tests.support.fake_kubelet.dra import Claim, FakeDraKubelet

    settings = Settings()
    if settings_file:
        from nodeagent.settings.load import load

        settings, _ = load(file=settings_file, groups=("dra", "mps", "mig"))
    control = control_program(simulate, root)
    cluster = dra_cluster()
    session = nvml_session(simulate, root)
    plugin_dir = root / "p"
    server = None
    claims: list[Claim] = []
    kubelet: FakeDraKubelet | None = None
    try:
        kube = KubeSettings(node_name=NODE, host=cluster.url, retry_seconds=1.0)
        api = DraApi(make_api_client(kube), kube)
        config = NodeConfig(DRIVER, NODE, plugin_dir, root / "cdi", mps_control=control)
        node = dra_driver(session, settings, config, _no_reset, root / ".mig.lock")
        sockets = Sockets(plugin_dir / "dra.sock", root / "reg" / f"{DRIVER}-reg.sock")
        server = KubeletPluginServer(node, api, DRIVER, sockets)
        server.start()
        kubelet = FakeDraKubelet(root / "reg")
        version = kubelet.register(DRIVER)
        for i, share in enumerate(shares):
            body = share_claim(f"{share.model}-share", f"voice-{i}-{uuid.uuid4().hex[:8]}", share)
            meta = body["metadata"]
            cluster.km.objects[CLAIMS, meta["namespace"], meta["name"]] = body
            claims.append(Claim(meta["namespace"], meta["name"], meta["uid"]))
        began = time.perf_counter()
        answers = kubelet.prepare(claims)
        seconds = time.perf_counter() - began
        clients = []
        for share, claim in zip(shares, claims, strict=True):
            answer = answers[claim.uid]
            if answer.error or not answer.devices:
                raise SystemExit(
                    f"voice benchmark: the DRA driver refused {share.model}'s share claim:"
                    f" {answer.error or 'no device prepared'}"
                )
            (cdi_id,) = answer.devices[0].cdi_ids
            clients.append(client_env(share.model, claim.uid, cdi_id, root / "cdi"))
        info = {"service": version, "simulate": simulate, "control": control}
        yield PreparedShares(clients, seconds, control, root, info)
    finally:
        if kubelet is not None and claims:
            with contextlib.suppress(Exception):  # best effort: leftovers are quit below
                errors = kubelet.unprepare(claims)
                bad = {uid: e for uid, e in errors.items() if e}
                if bad:
                    print(f"voice benchmark: unprepare failed: {bad}", file=sys.stderr)
        if server is not None:
            server.stop()
        _quit_daemons(control, plugin_dir)
        release_session(session, simulate)
        cluster.close()


@contextlib.contextmanager
def per_claim_daemons(
    shares: Sequence[Share], root: Path, simulate: str | None = None
) -> Iterator[PreparedShares]:
    """The design before issue 38: a control daemon per claim with the claim's limits as its
    defaults (nodeagent's MpsDaemon, as nodeagent.dra.node started one per share claim), each
    model's environment as that claim's CDI spec had it (own pipe directory, own limits)."""
    from nodeagent.base.units import parse_size
    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.settings import MpsSettings, validate
    from nodeagent.nvml import read_inventory

    control = control_program(simulate, root)
    session = nvml_session(simulate, root)
    daemons: list[MpsDaemon] = []
    clients = []
    try:
        inventory = read_inventory(session)
        began = time.perf_counter()
        for i, share in enumerate(shares):
            d = root / "mps" / f"claim-{i}"
            mib = parse_size(share.memory.removesuffix("i")) >> 20
            settings = MpsSettings(
                devices=(0,), thread_percentage=share.sm_percent,
                pinned_memory={0: f"{mib}M"}, pipe_dir=d / "pipe", log_dir=d / "log",
                ready_file=d / "ready", control_binary=control,
            )  # fmt: skip
            for folder in (settings.pipe_dir, settings.log_dir):
                folder.mkdir(parents=True, exist_ok=True)
            daemon = MpsDaemon(settings, validate(settings, inventory))
            daemons.append(daemon)
            daemon.start()
            env = {
                "NVIDIA_VISIBLE_DEVICES": inventory.gpus[0].uuid,
                PIPE_ENV: str(settings.pipe_dir),
                PCT_ENV: str(share.sm_percent),
                MEM_ENV: f"0={mib}M",
            }
            clients.append(ClientEnv(share.model, f"claim-{i}", "-", "-", env, []))
        seconds = time.perf_counter() - began
        yield PreparedShares(clients, seconds, control, root, {"simulate": simulate})
    finally:
        for daemon in daemons:
            daemon.stop()
        release_session(session, simulate)


def probe_clients(
    prepared: PreparedShares, envs: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, Any]]:
    """With the fake MPS daemon (fake models connect to nothing): a fake CUDA client started
    with each model's environment, and what the daemon gave it (its server, its limits)."""
    from tests.support.fake_mps.clients import FakeMpsClient

    started = {m: FakeMpsClient(envs[m]) for m in envs}
    try:
        return {m: c.answer(timeout=30) for m, c in started.items()}
    finally:
        for c in started.values():
            c.stop()


def servers_of(prepared: PreparedShares, pids: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Each model process's MPS server, as its daemon answers get_server_list and
    get_client_list <server> (the real daemon: a CUDA client is listed once its context is
    up, as the workers' are after their warm-up)."""
    import subprocess

    def ask(pipe: str, line: str) -> list[str]:
        env = {**os.environ, PIPE_ENV: pipe}
        done = subprocess.run(
            [prepared.control], input=line + "\n", env=env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        return done.stdout.split()

    out: dict[str, dict[str, Any]] = {}
    for c in prepared.clients:
        pipe = c.pipe_dir or ""
        found = None
        for server in ask(pipe, "get_server_list"):
            if str(pids[c.model]) in ask(pipe, f"get_client_list {server}"):
                found = int(server)
        out[c.model] = {"pid": pids[c.model], "pipe_dir": pipe, "server": found}
    return out


def shares_for(models: Sequence[str], sm_percent: int, memory: str) -> list[Share]:
    return [Share(m, sm_percent, memory) for m in models]


def environments(base: Mapping[str, str], prepared: PreparedShares) -> dict[str, dict[str, str]]:
    """Each model's whole environment (model_env) from its claim."""
    return {c.model: model_env(base, c) for c in prepared.clients}


__all__ = [
    "ClientEnv",
    "PreparedShares",
    "Share",
    "client_env",
    "environments",
    "model_env",
    "per_claim_daemons",
    "prepared_shares",
    "probe_clients",
    "servers_of",
    "share_claim",
    "shares_for",
]


# A look at what the driver writes: python benchmarks/voice/dra_shares.py [--simulate h200]
if __name__ == "__main__":
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description="prepare three share claims and print their CDI env")
    p.add_argument("--simulate", help="an emulated node spec (h200) with the fake MPS daemon")
    p.add_argument("--percent", type=int, default=30)
    p.add_argument("--memory", default="16Gi")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="voice-dra-", dir="/tmp") as tmp:
        shares = shares_for(("asr", "tts", "embed"), a.percent, a.memory)
        with prepared_shares(shares, Path(tmp), a.simulate) as prepared:
            print(json.dumps(prepared.summary(), indent=1))
