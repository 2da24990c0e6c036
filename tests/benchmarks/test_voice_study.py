"""The burst shares study (benchmarks/voice/study.py, verdict.py, `run.py --study`) on the CPU:
the shares' sizing, the interleaving, the SLO from the models alone, the verdict and the target,
the merge of calls; and one whole call on the emulator with the tests' fake MPS daemon and
fake models, through nodeagent's DRA driver. No timing assertions."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import report
import run
import slo
import study
import verdict

from nodeagent.dra.capacity import SM_STEP_PERCENT, share_capacity

MODELS = ("asr", "tts", "embed")
PCT, PRIO = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY"


@pytest.mark.parametrize(
    ("demand", "expected", "trimmed"),
    [
        # the voice trio's SM activity alone at 0.6 of capacity (H200, results/)
        ({"asr": 0.038, "tts": 0.045, "embed": 0.197}, {"asr": 5, "tts": 5, "embed": 20}, False),
        ({"a": 0.0, "b": 0.05, "c": 0.0501}, {"a": 5, "b": 5, "c": 10}, False),  # one step at least
        ({"a": 0.999}, {"a": 100}, False),
        # 60 + 55 > 100: the largest loses a step at a time
        ({"a": 0.6, "b": 0.55}, {"a": 50, "b": 50}, True),
    ],
)
def test_share_requests_round_demand_up_to_the_step_and_fit_one_gpu(
    demand: dict[str, float], expected: dict[str, int], trimmed: bool
) -> None:
    assert slo.share_requests(demand, SM_STEP_PERCENT) == (expected, trimmed)


def test_the_sizing_reads_the_share_devices_request_policy() -> None:
    """Every request the local sizing makes is one the share device's sm requestPolicy takes
    as it is (nodeagent.dra.capacity), and covers the demand."""
    policy = share_capacity("gpu.nodeagent.io", 80 << 30)["gpu.nodeagent.io/sm"]["requestPolicy"]
    low, high, step = (int(policy["validRange"][k]) for k in ("min", "max", "step"))
    for i in range(101):
        demand = i / 100 * 0.99
        got = slo.share_request_percent(demand, step)
        assert low <= got <= high and got % step == 0
        assert got >= 100 * demand - 1e-9


def test_the_modes_are_interleaved_round_after_round() -> None:
    order = slo.round_order(("solo", "time-slicing", "dra-burst"), 3)
    assert order == [(r, m) for r in (1, 2, 3) for m in ("solo", "time-slicing", "dra-burst")]


def test_spread_is_mean_min_max_and_stdev() -> None:
    s = slo.spread([0.98, 1.0, 0.99, math.nan])
    assert (s["n"], s["min"], s["max"]) == (3, 0.98, 1.0)
    assert s["mean"] == pytest.approx(0.99) and s["stdev"] == pytest.approx(0.01)
    assert slo.spread([0.5])["stdev"] == 0.0
    assert math.isnan(slo.spread([])["mean"])


@pytest.mark.parametrize(
    ("mode", "model", "expected"),
    [
        ("dra-capped", "asr", {"user": 7, "smLimit": 20}),  # limit = request: before issue 45
        ("dra-burst", "embed", {"user": 7}),  # the driver's default limit
        ("dra-low", "embed", {"user": 7, "priority": "low"}),
        ("dra-low", "asr", {"user": 7}),
    ],
)
def test_each_dra_mode_asks_its_claims_for_their_limit_and_priority(
    mode: str, model: str, expected: dict[str, Any]
) -> None:
    assert study.share_config(mode, model, "embed", 20, 7) == expected


def test_a_call_of_one_load_fits_one_gpu_command(capsys: pytest.CaptureFixture[str]) -> None:
    args = run.options(["--study"])
    assert args.modes == study.STUDY_MODES and args.rounds == 3 and args.slo_multiple == 3
    assert study.plan_seconds(args)["total"] <= study.FIT_SECONDS
    assert run.main(["--study", "--dry-run", "--loads", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "8 points of 10 s a round" in out and "too long" not in out


def test_all_loads_in_one_call_are_too_long_and_the_plan_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    code = run.main(["--study", "--dry-run", "--loads", "0.3,0.6,0.8", "--out", str(out_dir)])
    assert code == 0
    assert "too long for one GPU command: split --loads over calls" in capsys.readouterr().out
    assert not out_dir.exists()  # a dry run measures and writes nothing


def test_the_modes_run_in_the_studys_order_whatever_order_they_are_given() -> None:
    args = run.options(["--study", "--modes", "mps,dra-burst,solo"])
    assert args.modes == ("solo", "dra-burst", "mps")


# Synthetic calls: within-SLO shares per mode, load and model, one value per round.
ALONE = {0.3: [1.0, 1.0, 0.995], 0.6: [0.97, 0.96, 0.98], 0.8: [0.60, 0.70, 0.65]}


def call(
    within: dict[str, dict[float, list[float]]], loads: list[float], multiple: float = 3.0
) -> dict[str, Any]:
    """A call's results as run.py --study writes them: `within` mode -> load -> the rounds'
    share within SLO, the same for every model unless the mode's key names one ('mode:model')."""
    points = []
    for key, per_load in within.items():
        mode, _, only = key.partition(":")
        for load in loads:
            for r, share in enumerate(per_load.get(load, []), start=1):
                for m in MODELS:
                    if only and m != only:
                        continue
                    if not only and f"{mode}:{m}" in within:
                        continue
                    points.append({
                        "round": r, "mode": mode, "load": load, "model": m, "requests": 100,
                        "missed": 0, "p50": 0.01, "p99": 0.02 if share >= 0.99 else None,
                        "within_slo": share, "within_slo_windows": [share, share],
                        "latencies_ms": [10.0],
                    })  # fmt: skip
    meta = {
        "study": verdict.STUDY, "date": "2026-12-07T03:00:00+00:00", "gpu": "Test GPU",
        "driver": "1.2", "cuda": "13.0", "models": [{"name": m} for m in MODELS],
        "loads": loads, "modes": list(study.STUDY_MODES), "rounds": 3, "rounds_done": 3,
        "slo_multiple": multiple, "slo_load": 0.1, "point_seconds": 10, "seed": 17,
        "wall_seconds": 400.0,
    }  # fmt: skip
    calibration = {
        m: {"service_mean": 0.01, "capacity_per_second": 100.0, "slo_seconds": 0.06,
            "solo_p99_at_slo_load": 0.02}
        for m in MODELS
    }  # fmt: skip
    shares = {
        str(load): {
            "demand": {m: 0.1 * load for m in MODELS},
            "source": {m: "sm_active" for m in MODELS},
            "sm_request_percent": {m: 5 for m in MODELS},
            "trimmed": False,
        }
        for load in loads
    }
    return {"meta": meta, "calibration": calibration, "points": points, "shares": shares,
            "refused": {}, "mps": {}, "workers": {}}  # fmt: skip


BURST_HOLDS = {
    "solo": ALONE,
    "time-slicing": {0.3: [1.0, 0.97, 0.99], 0.6: [0.9, 0.8, 0.85], 0.8: [0.4, 0.5, 0.3]},
    "dra-capped": {0.3: [1.0, 1.0, 1.0], 0.6: [0.95, 0.97, 0.99], 0.8: [0.5, 0.4, 0.6]},
    "dra-burst": {0.3: [1.0, 1.0, 1.0], 0.6: [0.96, 0.96, 0.96], 0.8: [0.63, 0.64, 0.65]},
}


def test_the_verdict_per_mode_and_the_target_met() -> None:
    results = verdict.with_derived(call(BURST_HOLDS, [0.3, 0.6, 0.8]))
    d = results["derived"]
    assert d["solo_passing_load"] == {m: 0.3 for m in MODELS}
    assert d["reference_load"] == 0.3
    modes = d["modes"]
    assert modes["solo"]["gpus"] == 3
    assert (modes["dra-burst"]["passing_load"], modes["dra-burst"]["gpus"]) == (0.3, 1)
    assert modes["time-slicing"]["passing_load"] is None  # 98.7 % at 0.3 on average
    assert modes["time-slicing"]["gpus"] == math.inf
    assert modes["dra-burst"]["versus_alone"]["0.6"]["asr"] == pytest.approx(0.96 - 0.97)
    # 0.6: 96 vs 97 alone (-1 point); 0.8: 64 vs 65 (-1): within 2 points
    assert d["goal"]["checks"] == {"0.3": True, "0.6": True, "0.8": True}
    assert d["goal"]["outcome"] == "met"
    assert "-> **3 GPUs -> 1 at no loss of SLO**." in verdict.target_line(results)


def test_the_target_is_missed_by_one_model_three_points_below_alone() -> None:
    within = dict(
        BURST_HOLDS, **{"dra-burst:embed": {0.3: [1.0] * 3, 0.6: [0.94] * 3, 0.8: [0.7] * 3}}
    )
    results = verdict.with_derived(call(within, [0.3, 0.6, 0.8]))
    assert results["derived"]["goal"]["checks"]["0.6"] is False
    assert results["derived"]["goal"]["outcome"] == "missed"
    line = verdict.target_line(results)
    assert "embed 94.0 vs 97.0 alone (not each >= alone - 2)" in line
    assert line.endswith("**not 3 GPUs -> 1 at no loss of SLO**.")


def test_the_target_is_not_judged_without_every_load() -> None:
    results = verdict.with_derived(call(BURST_HOLDS, [0.3, 0.6]))
    assert results["derived"]["goal"]["checks"] == {"0.3": True, "0.6": True, "0.8": None}
    assert results["derived"]["goal"]["outcome"] == "not judged"
    assert "at 0.80 not measured" in verdict.target_line(results)


def test_without_a_load_every_model_holds_alone_there_is_no_reference() -> None:
    within = dict(BURST_HOLDS, solo={0.3: [0.98] * 3, 0.6: [0.9] * 3, 0.8: [0.6] * 3})
    results = verdict.with_derived(call(within, [0.3, 0.6, 0.8]))
    assert results["derived"]["reference_load"] is None
    assert results["derived"]["goal"]["checks"]["reference"] is None
    assert "no load at which every model alone holds >= 99 %" in verdict.target_line(results)


def test_the_report_has_each_points_mean_and_spread(tmp_path: Path) -> None:
    results = call(BURST_HOLDS, [0.3, 0.6, 0.8])
    verdict.write(results, tmp_path, "s", png=False)
    md = (tmp_path / "s.md").read_text()
    # solo 0.8: mean of 60, 70, 65; dra-burst 0.8: 64 against it, -1.0 point
    assert "| 0.80 | solo | 65.0 (60.0-70.0) |  | missed |" in md
    assert "| 0.30 | time-slicing | 98.7 (97.0-100.0) | -1.2 | 20.0-missed |" in md  # one missed
    assert "| 0.80 | dra-burst | 64.0 (63.0-65.0) | -1.0 |" in md
    assert "| DRA shares, default limit (burst) | 0.30 | 1 |" in md
    assert "| alone (1 pod per GPU) | 0.30 | 3 |" in md
    raw = json.loads((tmp_path / "s.json").read_text())
    assert raw["derived"]["goal"]["outcome"] == "met"


def test_calls_merge_into_one_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three calls (one load each, the docs' plan) and a fourth that repeats 0.6: one table,
    the repeated load's rounds pooled, the target judged over every load."""
    files = []
    for i, loads in enumerate(([0.3], [0.6], [0.8], [0.6])):
        results = call(BURST_HOLDS, loads)
        results["meta"]["seed"] = 17 + i
        verdict.write(results, tmp_path, f"call{i}", png=False)
        files.append(str(tmp_path / f"call{i}.json"))
    assert report.main([*files, "--out", str(tmp_path), "--name", "all", "--no-plot"]) == 0
    merged = json.loads((tmp_path / "all.json").read_text())
    assert merged["derived"]["goal"]["outcome"] == "met"
    assert sorted(merged["meta"]["loads"]) == [0.3, 0.6, 0.8]
    cell = verdict.cells(merged["points"])[("dra-burst", 0.6, "asr")]
    assert cell["rounds"] == 6 and cell["requests"] == 600
    md = (tmp_path / "all.md").read_text()
    assert md.count("\nCall ") == 4 and "Call 4: " in md
    assert "**3 GPUs -> 1 at no loss of SLO**" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (lambda: call(BURST_HOLDS, [0.6], multiple=5.0), "took another slo_multiple"),
        (
            lambda: dict(call(BURST_HOLDS, [0.6]), meta={"gpu": "x"}),
            "not a result of run.py --study",
        ),
        (
            lambda: dict(call(BURST_HOLDS, [0.6]), points=[{"mode": "solo"}]),
            "the files are not calls of one study",
        ),
    ],
)
def test_calls_of_another_rule_do_not_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: Any, message: str
) -> None:
    first = tmp_path / "a.json"
    first.write_text(json.dumps(call(BURST_HOLDS, [0.3])))
    other = tmp_path / "b.json"
    other.write_text(json.dumps(second()))
    with pytest.raises(SystemExit) as exc:
        report.main([str(first), str(other), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_study_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) makes the PNG")
    results = verdict.with_derived(call(BURST_HOLDS, [0.3, 0.6, 0.8]))
    assert verdict.plot(results, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# One whole call on the emulator: fake models (a sleep), the fake MPS daemon, nodeagent's DRA
# driver preparing the claims through the fake kubelet, kmock holding them.
FAKE = ("a=fake:service_ms=1", "b=fake:service_ms=3")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("kmock")
    out = tmp_path_factory.mktemp("study")
    argv = [
        "--study", "--device", "cpu", "--simulate", "h200", "--loads", "0.3", "--rounds", "3",
        "--point-seconds", "0.1", "--slo-seconds", "0.2", "--calibrate-seconds", "0.05",
        "--idle", "sleep", "--no-plot", "--out", str(out), "--mps-dir", str(out / "mps"),
    ]  # fmt: skip
    for m in FAKE:
        argv += ["--model", m]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run.main(argv)
    raw = json.loads((out / "voice.json").read_text())
    return {"code": code, "out": printed.getvalue(), "raw": raw, "dir": out}


def test_a_simulated_call_measures_the_slo_alone_and_interleaves_the_rounds(
    simulated: dict[str, Any],
) -> None:
    assert simulated["code"] == 0
    raw = simulated["raw"]
    # each model's SLO: 3 x its own p99 alone at load 0.1, measured in this call
    for p in raw["slo_points"]:
        assert p["load"] == 0.1 and p["mode"] == "slo"
        assert raw["calibration"][p["model"]]["slo_seconds"] == pytest.approx(3 * p["p99"])
    # the points in the order measured: every mode once a round, round after round
    seen: list[tuple[int, str]] = []
    for p in raw["points"]:
        if (p["round"], p["mode"]) not in seen:
            seen.append((p["round"], p["mode"]))
    ran = [m for m in study.STUDY_MODES if any(p["mode"] == m for p in raw["points"])]
    assert seen == slo.round_order(ran, 3)
    assert raw["meta"]["rounds_done"] == 3
    assert {"solo", "time-slicing", "dra-burst", "mps"} <= set(ran)
    # the solo points are each model alone: one model a point
    solo = [p for p in raw["points"] if p["mode"] == "solo"]
    assert len(solo) == 3 * 2
    assert (
        "Target (DRA shares, default limit (burst))" in (simulated["dir"] / "voice.md").read_text()
    )


def test_a_simulated_call_sizes_each_claim_from_round_1s_demand(
    simulated: dict[str, Any],
) -> None:
    raw = simulated["raw"]
    shares = raw["shares"]["0.3"]
    round_1 = {p["model"]: p for p in raw["points"] if p["mode"] == "solo" and p["round"] == 1}
    assert shares["demand"] == {m: round_1[m]["busy_fraction"] for m in "ab"}
    assert shares["source"] == {"a": "process", "b": "process"}  # no GPU counter on the CPU
    requests = shares["sm_request_percent"]
    assert (requests, shares["trimmed"]) == slo.share_requests(shares["demand"], SM_STEP_PERCENT)
    assert sum(requests.values()) <= 100
    for key, made in raw["mps"].items():
        if not key.startswith("dra-"):
            continue
        mode = key.split("@")[0]
        for asked in made["shares"]:
            m = asked["model"]
            assert asked["sm_request_percent"] == requests[m]
            config = {k: v for k, v in asked["config"].items() if k not in ("apiVersion", "kind")}
            assert config == study.share_config(mode, m, "b", requests[m], os.getuid())


def test_a_simulated_calls_claims_carry_their_limit_and_priority(
    simulated: dict[str, Any],
) -> None:
    """What the claims' CDI env must hold once the driver reads MpsShare's smLimit and
    priority (issue 45 item 1): capped at the request, the default limit 100, the embedder's
    priority low (1); the fake MPS daemon gives each client that limit."""
    raw = simulated["raw"]
    assert raw["refused"] == {}
    requests = raw["shares"]["0.3"]["sm_request_percent"]
    expected = {
        "dra-capped": ({m: str(requests[m]) for m in "ab"}, {"a": "0", "b": "0"}),
        "dra-burst": ({"a": "100", "b": "100"}, {"a": "0", "b": "0"}),
        "dra-low": ({"a": "100", "b": "100"}, {"a": "0", "b": "1"}),
    }
    for mode, (limits, priorities) in expected.items():
        made = raw["mps"][f"{mode}@0.3"]
        envs = {c["model"]: c["env"] for c in made["claims"]}
        assert {m: e[PCT] for m, e in envs.items()} == limits, mode
        assert {m: e.get(PRIO, "0") for m, e in envs.items()} == priorities, mode
        answers = made["clients"]
        assert {m: a["active_thread_percentage"] for m, a in answers.items()} == {
            m: f"{float(v):.1f}" for m, v in limits.items()
        }, mode
    assert {p["mode"] for p in raw["points"]} == set(study.STUDY_MODES)
