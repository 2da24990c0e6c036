"""CPU smoke of the voice consolidation benchmark (benchmarks/voice/): arrival generation, the
open-loop server, SLO maths and report writing, with fake models. No torch, no GPU."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import report
import run
import slo

INF = math.inf


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate() -> None:
    arrivals = slo.poisson_arrivals(200.0, 100.0, seed=3)
    assert arrivals == slo.poisson_arrivals(200.0, 100.0, seed=3)
    assert arrivals != slo.poisson_arrivals(200.0, 100.0, seed=4)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals[-1] < 100.0
    # 20000 expected, standard deviation ~141: 3 % is > 4 sigma.
    assert len(arrivals) == pytest.approx(20000, rel=0.03)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Exponential gaps: mean = standard deviation = 1 / rate.
    assert statistics.mean(gaps) == pytest.approx(1 / 200, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / 200, rel=0.05)
    assert slo.poisson_arrivals(0.0, 10.0, seed=1) == []


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        (list(range(1, 101)), 50, 50),
        (list(range(1, 101)), 99, 99),
        (list(range(1, 101)), 99.9, 100),
        ([5.0, 1.0, 3.0], 50, 3.0),
        ([1.0] * 99 + [INF], 99, 1.0),
        ([1.0] * 98 + [INF, INF], 99, INF),
        ([2.0], 99.9, 2.0),
        # 99.9 / 100 * 1000 is 999.0000000000001 in floating point: still rank 999
        ([float(i) for i in range(1, 1001)], 99.9, 999.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert slo.percentile(values, q) == expected


def test_percentile_and_attainment_of_nothing_are_nan() -> None:
    assert math.isnan(slo.percentile([], 99))
    assert math.isnan(slo.attainment([], 1.0))


def test_attainment_counts_missed_requests_outside() -> None:
    assert slo.attainment([0.1, 0.2, INF, 0.4], 0.3) == 0.5
    assert slo.attainment([0.1, 0.3], 0.3) == 1.0  # at the SLO is within it


def test_slo_is_a_multiple_of_solo_p99() -> None:
    service = [0.010] * 99 + [0.020]
    assert slo.slo_seconds(service, 5) == pytest.approx(0.050)
    assert slo.slo_seconds([0.010] * 98 + [0.020] * 2, 5) == pytest.approx(0.100)


class VirtualClock:
    """A fake model on a virtual clock: a request takes `service` seconds, waiting is free."""

    def __init__(self, service: float) -> None:
        self.t = 0.0
        self.service = service

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def serve(self) -> None:
        self.t += self.service


def test_open_loop_server_measures_queueing_like_a_fifo_queue() -> None:
    arrivals = slo.poisson_arrivals(80.0, 20.0, seed=5)  # load 0.8 of a 10 ms model
    clock = VirtualClock(0.010)
    measured = slo.serve_open_loop(arrivals, clock.serve, clock.now, clock.wait_until, 1e9)
    expected = slo.fifo_latencies(arrivals, [0.010] * len(arrivals))
    assert measured == pytest.approx(expected)
    assert min(measured) == pytest.approx(0.010)
    assert max(measured) > 0.05  # queueing shows


def test_open_loop_server_gives_up_on_a_backlog() -> None:
    arrivals = [0.0, 0.001, 0.002, 0.003]
    clock = VirtualClock(1.0)  # far slower than the arrivals
    latencies = slo.serve_open_loop(arrivals, clock.serve, clock.now, clock.wait_until, 1.5)
    assert latencies[:2] == pytest.approx([1.0, 1.999])
    assert latencies[2:] == [INF, INF]


def test_fifo_queue_at_low_load_meets_a_5x_slo_and_breaks_near_capacity() -> None:
    def within(load: float) -> float:
        arrivals = slo.poisson_arrivals(load / 0.01, 300.0, seed=7)
        return slo.attainment(slo.fifo_latencies(arrivals, [0.01] * len(arrivals)), 0.05)

    assert within(0.3) > 0.999
    assert within(0.9) < 0.8


def test_windows_split_by_arrival_time() -> None:
    summary = slo.summarize([0.1, 0.2, 0.6, 0.9], [0.01, 0.01, 0.5, 0.01], 0.1, 1.0, 2)
    assert summary["requests"] == 4
    assert summary["within_slo"] == 0.75
    assert summary["within_slo_windows"] == [1.0, 0.5]
    assert summary["p50"] == 0.01 and summary["p99"] == 0.5


@pytest.mark.parametrize(
    ("within", "expected"),
    [
        ({0.2: 1.0, 0.4: 0.995, 0.6: 0.97, 0.8: 0.999}, 0.4),  # a lucky pass above a failure
        ({0.2: 0.98, 0.4: 1.0}, None),
        ({0.2: 0.99, 0.4: 0.99}, 0.4),
        ({0.2: 1.0, 0.4: math.nan}, 0.2),
    ],
)
def test_highest_passing_load(within: dict[float, float], expected: float | None) -> None:
    assert slo.highest_passing_load(within) == expected


def test_together_every_model_must_pass() -> None:
    table = {"asr": {0.2: 1.0, 0.4: 1.0, 0.6: 0.95}, "tts": {0.2: 1.0, 0.4: 0.98, 0.6: 1.0}}
    assert slo.together_passing(table) == 0.2


@pytest.mark.parametrize(
    ("passing", "expected"),
    [(0.6, 1), (0.4, 2), (0.2, 3), (0.1, 6), (None, INF)],
)
def test_gpus_together(passing: float | None, expected: float) -> None:
    traffic = {"asr": 0.4, "tts": 0.6, "embed": 0.4}
    assert slo.gpus_together(traffic, passing) == expected


def test_gpus_solo_is_one_pod_per_gpu() -> None:
    traffic = {"asr": 0.4, "tts": 0.6, "embed": 0.4}
    assert slo.gpus_solo(traffic, traffic) == 3
    assert slo.gpus_solo({"asr": 1.0, "tts": 0.6}, {"asr": 0.4, "tts": 0.6}) == 4
    assert slo.gpus_solo(traffic, {"asr": None, "tts": 0.6, "embed": 0.4}) == INF


def test_weighted_percentages_follow_gpu_time() -> None:
    weights = slo.weighted_percentages({"asr": 0.2, "tts": 0.3, "embed": 0.5})
    assert weights == {"asr": 20, "tts": 30, "embed": 50}
    skewed = slo.weighted_percentages({"asr": 0.001, "tts": 0.3, "embed": 0.9})
    assert skewed["asr"] == 5 and sum(skewed.values()) <= 100
    assert skewed["embed"] > skewed["tts"] > skewed["asr"]


def test_plan_adds_up() -> None:
    plan = slo.plan_seconds(3, 4, 10, 3, 24, 2, 16, 1, 3, 3, 25)
    assert plan["solo"] == 3 * 4 * 11
    assert plan["together"] == 3 * 4 * 25
    assert plan["total"] == sum(v for k, v in plan.items() if k != "total")


def synthetic_results() -> dict[str, Any]:
    """Two models, known attainment: solo passes to 0.4 (a) and 0.6 (b); time-slicing to 0.2."""
    within = {
        "solo": {"a": [1.0, 0.995, 0.9], "b": [1.0, 1.0, 0.999]},
        "time-slicing": {"a": [1.0, 0.95, 0.5], "b": [1.0, 0.99, 0.9]},
        "mps-equal": {"a": [1.0, 1.0, 0.999], "b": [1.0, 0.999, 0.995]},
    }
    points = []
    for mode, models in within.items():
        for model, shares in models.items():
            for load, share in zip((0.2, 0.4, 0.6), shares, strict=True):
                points.append(
                    {
                        "mode": mode,
                        "load": load,
                        "model": model,
                        "requests": 100,
                        "missed": 0,
                        "p50": 0.01,
                        "p99": 0.02 if share >= 0.99 else INF,
                        "p999": 0.03,
                        "within_slo": share,
                        "within_slo_windows": [share, share],
                    }
                )
    calibration = {
        m: {
            "service_mean": 0.01,
            "service_p99": 0.012,
            "capacity_per_second": 100.0,
            "slo_seconds": 0.06,
            "requests": 30,
            "activity": {},
        }
        for m in ("a", "b")
    }
    meta = {
        "gpu": "Test GPU",
        "driver": "1.2",
        "cuda": "13.0",
        "date": "2026-12-02T00:00:00+00:00",
        "quick": False,
        "seed": 17,
        "slo_multiple": 5,
        "solo_seconds": 10,
        "point_seconds": 24,
        "isolation_seconds": 16,
        "isolation_load": 0.2,
        "wall_seconds": 1.0,
    }
    return {
        "meta": meta,
        "calibration": calibration,
        "points": points,
        "isolation": [dict(points[0], mode="mps-equal", hog_iterations_per_second=12.5)],
        "mps": {"mps-equal": {"client_thread_percentage": {"a": 50, "b": 50}}},
        "workers": {"a": {"description": "fake a"}, "b": {"description": "fake b"}},
    }


def test_derive_passing_loads_and_gpus() -> None:
    results = synthetic_results()
    derived = report.derive(results)
    assert derived["solo_passing_load"] == {"a": 0.4, "b": 0.6}
    assert derived["reference_load"] == 0.4
    modes = derived["modes"]
    assert modes["solo"]["gpus"] == 2
    assert modes["time-slicing"]["passing_load"] == 0.2
    assert modes["time-slicing"]["gpus"] == 3  # b's 0.6 over 0.2 per GPU
    assert modes["mps-equal"]["passing_load"] == 0.6
    assert modes["mps-equal"]["gpus"] == 1
    assert modes["time-slicing"]["worst_within_at_solo_load"] == 0.95


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_report_writes_markdown_and_json(tmp_path: Path) -> None:
    results = synthetic_results()
    results["derived"] = report.derive(results)
    paths = report.write(results, tmp_path, "voice", png=False)
    md = (tmp_path / "voice.md").read_text()
    assert "Test GPU, driver 1.2" in md
    assert "| together, MPS 100//n each | a 50%, b 50% | 0.60 | 99.9 | 1 |" in md
    assert "| 0.40 | time-slicing | 95.0 (95.0-95.0) | missed | 100 |" in md
    assert "| together, MPS 100//n each | a | 100.0 (100.0-100.0) |" in md
    raw = strict_json((tmp_path / "voice.json").read_text())
    assert raw["derived"]["modes"]["mps-equal"]["gpus"] == 1
    assert raw["derived"]["modes"]["solo"]["passing_load"] == 0.4
    assert paths == [tmp_path / "voice.json", tmp_path / "voice.md"]


def test_report_plots_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) makes the PNG")
    results = synthetic_results()
    results["derived"] = report.derive(results)
    assert report.plot(results, tmp_path / "voice.png")
    assert (tmp_path / "voice.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_whole_run_on_fake_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run.py end to end on the CPU: worker processes, calibration, solo and time-sliced
    points, the batch job beside them, the report (MPS modes need a GPU and are left out)."""
    code = run.main(
        [
            "--device",
            "cpu",
            "--model",
            "a=fake:service_ms=1",
            "--model",
            "b=fake:service_ms=3",
            "--loads",
            "0.3",
            "--solo-seconds",
            "0.15",
            "--point-seconds",
            "0.2",
            "--isolation-seconds",
            "0.15",
            "--calibrate-seconds",
            "0.05",
            "--idle",
            "sleep",
            "--no-plot",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "plan: 2 models x 1 loads" in out
    raw = strict_json((tmp_path / "voice.json").read_text())
    modes = {(p["mode"], p["model"], p["load"]) for p in raw["points"]}
    assert modes == {(m, x, 0.3) for m in ("solo", "time-slicing") for x in "ab"}
    assert {p["model"] for p in raw["isolation"]} == {"a", "b"}
    assert all(p["hog_iterations_per_second"] > 0 for p in raw["isolation"])
    cal = raw["calibration"]["a"]
    assert cal["service_mean"] > 0  # a time measured on a loaded CI machine: no bound on it
    assert all(len(p["latencies_ms"]) == p["requests"] for p in raw["points"])
    assert "| alone (1 pod per GPU) |" in (tmp_path / "voice.md").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loads", "abc"], "are not numbers"),
        (["--loads", "0,0.5"], "fractions of solo capacity"),
        (["--model", "llama"], "unknown model kind 'llama'"),
        (["--model", "a=fake:service_ms"], "is not key=value"),
        (["--modes", "time-slicing"], "keep it"),
        (["--model", "asr", "--model", "asr"], "given twice"),
        (["--share-percent", "33"], "multiple of 5"),  # the DRA modes' options and the presets
        (["--share-percent", "40"], "do not fit one GPU"),
        (["--simulate", "h200"], "with --device cpu"),
        (["--quick", "--study"], "choose one"),
        (["--study", "--rounds", "0"], "--rounds is a number of rounds"),
        (["--study", "--slo-load", "1.5"], "--slo-load is a fraction"),
        (["--study", "--slo-multiple", "1"], "--slo-multiple is above 1"),
        (["--study", "--point-seconds", "0"], "are seconds above 0"),
        (["--study", "--modes", "solo,mps-equal"], "unknown modes ['mps-equal']"),
        (["--study", "--modes", "dra-burst"], "keep it"),
        (["--dry-run"], "give --study"),
    ],
)
def test_bad_options_are_one_sentence_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        run.options(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_repeated_runs_pool_their_requests(tmp_path: Path) -> None:
    first, second = synthetic_results(), synthetic_results()
    for results, share in ((first, 1.0), (second, 0.96)):
        for p in results["points"]:
            p["latencies_ms"] = [10.0] * p["requests"]
            if (p["mode"], p["load"], p["model"]) == ("mps-equal", 0.6, "a"):
                p["within_slo"] = share
        results["derived"] = report.derive(results)
    files = []
    for i, results in enumerate((first, second)):
        report.write(results, tmp_path, f"run{i}", png=False)
        files.append(str(tmp_path / f"run{i}.json"))
    assert report.main([*files, "--out", str(tmp_path), "--name", "pooled", "--no-plot"]) == 0
    pooled = strict_json((tmp_path / "pooled.json").read_text())
    point = next(
        p for p in pooled["points"] if (p["mode"], p["load"], p["model"]) == ("mps-equal", 0.6, "a")
    )
    assert point["requests"] == 200
    assert point["within_slo"] == pytest.approx(0.98)  # (100 x 1.0 + 100 x 0.96) / 200
    assert point["within_slo_runs"] == [1.0, 0.96]
    assert pooled["derived"]["modes"]["mps-equal"]["passing_load"] == 0.4  # 0.98 < 99 %
    assert "Run 2: 2026-12-02T00:00:00+00:00, seed 17" in (tmp_path / "pooled.md").read_text()


def test_pooling_refuses_a_file_that_is_not_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        report.main([str(bad)])
    assert exc.value.code == 2
    assert "not a results file of run.py" in capsys.readouterr().err


def test_without_nvml_the_gpu_run_says_so_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pynvml")
    from nodeagent.base.errors import AgentError
    from nodeagent.nvml import load_real_library, open_session

    try:
        open_session(load_real_library())
    except AgentError:
        pass
    else:
        pytest.skip("this machine has NVML: the GPU run would start")
    assert run.main(["--quick", "--no-isolation", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("voice benchmark: NVML") and "Traceback" not in err
    assert not list(tmp_path.iterdir())
