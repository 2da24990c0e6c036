"""The voice study's DRA modes on the CPU (benchmarks/voice/dra_shares.py): three MPS share
claims prepared by nodeagent's DRA kubelet plugin through the fake kubelet, on the emulator with
the tests' fake MPS daemon; each model's environment is exactly its claim's CDI spec, and a
fake CUDA client started with it gets its claim's limits. Written against what the spec says
(how many daemons the claims share is the driver's business: three today, one after issue 38),
not against a fixed layout."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import dra_shares
import pytest
import run
import slo

from nodeagent.mps.control import process_alive

pytest.importorskip("kmock")

SHARES = [
    dra_shares.Share("asr", 30, "16Gi"),
    dra_shares.Share("tts", 20, "8Gi"),
    dra_shares.Share("embed", 45, "4Gi"),
]
LIMITS = {"asr": ("30", 16 << 10), "tts": ("20", 8 << 10), "embed": ("45", 4 << 10)}  # %, MiB


@pytest.fixture
def root() -> Any:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="voice-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _spec_env(client: dra_shares.ClientEnv) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The claim's device's env and mounts, read here from the spec file the driver wrote."""
    spec = json.loads(Path(client.spec_file).read_text())
    name = client.cdi_id.split("=", 1)[1]
    (device,) = [d for d in spec["devices"] if d["name"] == name]
    edits = device["containerEdits"]
    env = dict(e.split("=", 1) for e in edits["env"])
    return env, edits.get("mounts", [])


def test_three_share_claims_give_three_client_environments_with_their_own_limits(
    root: Path,
) -> None:
    base = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": "/elsewhere", "KEEP": "me"}
    with dra_shares.prepared_shares(SHARES, root, simulate="h200") as made:
        assert [c.model for c in made.clients] == ["asr", "tts", "embed"]
        specs = {c.model: _spec_env(c) for c in made.clients}
        envs = dra_shares.environments(base, made)
        pipes = set()
        for c in made.clients:
            env, mounts = specs[c.model]
            _, mib = LIMITS[c.model]
            # the claim's memory as its consumed capacity said; its SM ceiling the default
            # limit (100: a share's request is what the scheduler counts, and it bursts)
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
            assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
            # the model's environment: the harness's, less its MPS variables, then the spec's
            assert envs[c.model] == {
                **{k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")},
                **env,
            }
            assert envs[c.model]["KEEP"] == "me"
            pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
            pipes.add(pipe)
            assert [m["hostPath"] for m in mounts] == [pipe] == c.skipped_mounts
            assert all(m["hostPath"] == m["containerPath"] for m in mounts)
        assert made.daemons() == len(pipes)

        answers = dra_shares.probe_clients(made, envs)  # a CUDA client with each environment
        for model, got in answers.items():
            _, mib = LIMITS[model]
            assert got["active_thread_percentage"] == "100.0", (model, got)
            assert got["pinned_device_mem_limit"] == {"0": f"{mib // 1024}G"}, (model, got)
        # one server per daemon: the clients of one pipe directory share its server
        by_pipe: dict[str, set[int]] = {}
        for c in made.clients:
            by_pipe.setdefault(c.pipe_dir or "", set()).add(answers[c.model]["server"])
        assert all(len(servers) == 1 for servers in by_pipe.values())
        assert len({s for servers in by_pipe.values() for s in servers}) == len(pipes)
        daemons = [
            int(p.read_text()) for p in (root / "p").glob("mps*/**/nvidia-cuda-mps-control.pid")
        ]
        assert daemons and all(process_alive(pid) for pid in daemons)
    # unprepared: no spec, no daemon left
    assert not list((root / "cdi").glob("*.json"))
    assert not any(process_alive(pid) for pid in daemons)


def test_a_daemon_per_claim_gives_each_model_its_own_daemon_and_limits(root: Path) -> None:
    with dra_shares.per_claim_daemons(SHARES, root, simulate="h200") as made:
        assert made.daemons() == 3
        answers = dra_shares.probe_clients(made, dra_shares.environments(os.environ, made))
        assert len({a["server"] for a in answers.values()}) == 3
        for model, got in answers.items():
            pct, mib = LIMITS[model]
            assert got["active_thread_percentage"] == f"{float(pct):.1f}"
            assert got["pinned_device_mem_limit"] == {"0": f"{mib // 1024}G"}


def test_a_mount_a_process_cannot_have_is_one_sentence(tmp_path: Path) -> None:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "k8s.gpu.nodeagent.io/claim",
        "devices": [
            {
                "name": "u-gpu-0-mps",
                "containerEdits": {
                    "env": ["CUDA_MPS_PIPE_DIRECTORY=/mps/pipe"],
                    "mounts": [{"hostPath": "/host/pipe", "containerPath": "/mps/pipe"}],
                },
            }
        ],
    }
    (tmp_path / "k8s.gpu.nodeagent.io-claim_u.json").write_text(json.dumps(spec))
    with pytest.raises(SystemExit, match="host and container paths are equal"):
        dra_shares.client_env("asr", "u", "k8s.gpu.nodeagent.io/claim=u-gpu-0-mps", tmp_path)
    with pytest.raises(SystemExit, match="no CDI spec"):
        dra_shares.client_env("asr", "u", "k8s.gpu.nodeagent.io/claim=other", tmp_path)


def test_a_whole_dry_run_through_the_dra_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run.main(
        [
            "--device", "cpu", "--simulate", "h200",
            "--model", "a=fake:service_ms=1", "--model", "b=fake:service_ms=3",
            "--loads", "0.3", "--min-requests", "12", "--solo-seconds", "0.05",
            "--point-seconds", "0.05", "--calibrate-seconds", "0.05", "--idle", "sleep",
            "--share-percent", "40", "--no-plot", "--no-isolation",
            "--modes", "solo,dra-shares,dra-per-claim", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    raw = json.loads((tmp_path / "voice.json").read_text())
    modes = {(p["mode"], p["model"]) for p in raw["points"]}
    assert modes == {(m, x) for m in ("solo", "dra-shares", "dra-per-claim") for x in "ab"}
    assert all(p["requests"] >= 12 for p in raw["points"])
    # share claims: the request (40) is scheduled, the ceiling the default limit (100); a
    # daemon per claim: its MpsConfig's thread percentage
    for mode, ceiling in (("dra-shares", "100"), ("dra-per-claim", "40")):
        summary = raw["mps"][mode]
        assert summary["client_thread_percentage"] == {"a": ceiling, "b": ceiling}
        got = {c["active_thread_percentage"] for c in summary["clients"].values()}
        assert got == {f"{ceiling}.0"}
    text = (tmp_path / "voice.md").read_text()
    assert "together, DRA share claims: 2 claims prepared by nodeagent's DRA driver" in text
    assert "| together, DRA share claims | a 100%, b 100% |" in text  # their ceilings


def test_min_requests_makes_each_point_long_enough_for_every_model() -> None:
    args = run.options(["--device", "cpu", "--model", "a=fake", "--model", "b=fake",
                        "--min-requests", "120", "--point-seconds", "1"])  # fmt: skip
    study = run.Study(args)
    rates = {"a": 3.75, "b": 60.0}
    seconds = study.point_seconds(1.0, rates, 0)
    seeds = study.seeds(0)
    counts = {n: len(slo.poisson_arrivals(r, seconds, seeds[n])) for n, r in rates.items()}
    assert min(counts.values()) == 120  # the slowest stream decides, exactly
    assert seconds == pytest.approx(120 / 3.75, rel=0.35)
    assert study.point_seconds(1.0, rates, 0) == seconds  # seeded: the same every time


def test_the_report_says_what_the_dra_modes_ran_on() -> None:
    import report

    results: dict[str, Any] = {
        "mps": {
            "dra-shares": {
                "service": "v1.DRAPlugin", "prepare_seconds": 1.0, "daemons": 1,
                "claims": [{"skipped_mounts": ["/p"]}] * 3,
                "clients": {m: {"server": 7} for m in "abc"},
            },
        }
    }  # fmt: skip
    (line,) = [x for x in report._dra_lines(results) if x]
    assert "3 claims prepared by nodeagent's DRA driver" in line
    assert "1 MPS control daemon(s), 1 MPS server(s)" in line
    assert "3 mount(s) not bound" in line
