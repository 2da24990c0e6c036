"""The voice benchmark's report: what the points mean (passing loads, GPUs needed), a Markdown
table, the raw results as JSON and a PNG plot (where matplotlib is importable)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import slo
import verdict

TARGET = 0.99
MODE_LABELS = {
    "solo": "alone (1 pod per GPU)",
    "time-slicing": "together, time-slicing",
    "mps-equal": "together, MPS 100//n each",
    "mps-weighted": "together, MPS weighted",
    "dra-shares": "together, DRA share claims",
    "dra-per-claim": "together, DRA shares, a daemon per claim",
}


def within_table(points: list[dict[str, Any]]) -> dict[str, dict[str, dict[float, float]]]:
    """mode -> model -> load -> share within SLO."""
    out: dict[str, dict[str, dict[float, float]]] = {}
    for p in points:
        out.setdefault(p["mode"], {}).setdefault(p["model"], {})[p["load"]] = p["within_slo"]
    return out


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """Per mode the highest load at which every model keeps >= 99 % within SLO, and the GPUs
    each mode needs for the traffic that one pod per GPU carries at its own passing load."""
    within = within_table(results["points"])
    models = list(results["calibration"])
    solo = {m: slo.highest_passing_load(within.get("solo", {}).get(m, {}), TARGET) for m in models}
    traffic = {m: load for m, load in solo.items() if load}
    reference = min(traffic.values()) if len(traffic) == len(models) else None
    modes: dict[str, Any] = {}
    for mode, table in within.items():
        if mode == "solo":
            passing: float | None = reference
            gpus = slo.gpus_solo(traffic, solo) if len(traffic) == len(models) else math.inf
        else:
            passing = slo.together_passing(table, TARGET)
            gpus = slo.gpus_together(traffic, passing) if traffic else math.inf
        at_reference = (
            min(table[m].get(reference, math.nan) for m in models) if reference else math.nan
        )
        modes[mode] = {
            "passing_load": passing,
            "worst_within_at_solo_load": at_reference,
            "gpus": gpus,
        }
    return {
        "target": TARGET,
        "solo_passing_load": solo,
        "traffic_load": traffic,
        "reference_load": reference,
        "modes": modes,
    }


def markdown(results: dict[str, Any]) -> str:
    meta, cal, derived = results["meta"], results["calibration"], results["derived"]
    runs = meta.get("runs", [meta])
    lines = [
        "# Consolidation study: voice AI on one GPU",
        "",
        f"GPU: {meta['gpu']}, driver {meta['driver']}, CUDA {meta['cuda']};"
        f" {meta.get('wall_seconds', 0):.0f} s in all{' (--quick)' if meta['quick'] else ''}.",
        f"Open-loop Poisson arrivals, one request at a time per model process; SLO ="
        f" {meta['slo_multiple']:g} x solo p99 with no queueing; loads are fractions of each"
        " model's solo capacity.",
        *(
            f"{'Run ' + str(i + 1) + ': ' if len(runs) > 1 else ''}{m['date']}, seed {m['seed']},"
            f" solo points {m['solo_seconds']:g} s, together points {m['point_seconds']:g} s,"
            + (
                f" isolation {m['isolation_seconds']:g} s."
                if results["isolation"]
                and any(p.get("run", 1) == i + 1 for p in results["isolation"])
                else " no isolation."
            )
            for i, m in enumerate(runs)
        ),
        (
            f"Each point pools the requests of the {len(runs)} runs; in brackets the range over"
            " the runs' halves (each point is split in two windows); where two numbers are"
            " separated by /, they are the runs' own."
            if len(runs) > 1
            else "Each point is split in two windows: their range in brackets."
        ),
        *(
            [f"Not measured: {', '.join(meta['skipped'])} (the run's time budget)."]
            if meta.get("skipped")
            else []
        ),
        *(["Interrupted: only the points measured before it."] if meta.get("interrupted") else []),
        "",
        "| model | workload | service mean ms | service p99 ms | capacity /s | SLO ms |"
        " GPU memory MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in cal.items():
        w = results["workers"].get(name, {})
        memory = w.get("gpu_memory_bytes")
        per_run = c.get("runs", [c])

        def each(key: str, fmt: Any, per_run: list[dict[str, Any]] = per_run) -> str:
            return "/".join(fmt(r[key]) for r in per_run)

        lines.append(
            f"| {name} | {w.get('description', '')} | {each('service_mean', slo.fmt_ms)} |"
            f" {each('service_p99', slo.fmt_ms)} | {each('capacity_per_second', '{:.1f}'.format)} |"
            f" {each('slo_seconds', slo.fmt_ms)} | {'-' if memory is None else memory >> 20} |"
        )
    lines += [
        "",
        f"Traffic: each model at the highest load it carries alone with >= {TARGET:.0%} within"
        " SLO ("
        + ", ".join(f"{m} {slo.fmt_load(v)}" for m, v in derived["solo_passing_load"].items())
        + ").",
        "",
        "| mode | MPS threads | highest load, every model >= 99 % | worst model at solo's load"
        f" ({slo.fmt_load(derived['reference_load'])}) % | GPUs for the traffic |",
        "|---|---|---|---|---|",
    ]
    for mode, d in derived["modes"].items():
        mps = results["mps"].get(mode)
        threads = (
            ", ".join(f"{m} {p}%" for m, p in mps["client_thread_percentage"].items())
            if mps
            else "-"
        )
        lines.append(
            f"| {MODE_LABELS.get(mode, mode)} | {threads} | {slo.fmt_load(d['passing_load'])} |"
            f" {slo.fmt_pct(d['worst_within_at_solo_load'])} | {slo.fmt_gpus(d['gpus'])} |"
        )
    lines += _dra_lines(results)
    lines += ["", _points_table(results["points"], list(cal)), ""]
    if results["isolation"]:
        lines += [
            f"Isolation: the light models at load {meta['isolation_load']:g} beside a batch job"
            " in an unbounded loop (a fourth process).",
            "",
            "| mode | model | within SLO % | p50 ms | p99 ms | batch job it/s |",
            "|---|---|---|---|---|---|",
        ]
        for p in results["isolation"]:
            lines.append(
                f"| {MODE_LABELS.get(p['mode'], p['mode'])} | {p['model']} |"
                f" {_cell_pct(p)} | {slo.fmt_ms(p['p50'])} | {slo.fmt_ms(p['p99'])} |"
                f" {p.get('hog_iterations_per_second', math.nan):.1f} |"
            )
    return "\n".join(lines) + "\n"


def _dra_lines(results: dict[str, Any]) -> list[str]:
    """What the DRA modes ran on: the claims' MPS daemons and the servers their clients got."""
    lines = []
    for mode in ("dra-shares", "dra-per-claim"):
        d = results["mps"].get(mode)
        if not d or "daemons" not in d:
            continue
        clients = d.get("clients") or {}
        servers = {c.get("server") for c in clients.values() if c.get("server") is not None}
        how = (
            "prepared by nodeagent's DRA driver through the fake kubelet"
            if d.get("service")
            else "a control daemon per claim, as the driver ran them before issue 38"
        )
        skipped = sum(len(c.get("skipped_mounts", [])) for c in d.get("claims", []))
        lines.append(
            f"{MODE_LABELS[mode]}: {len(d.get('claims', []))} claims {how}"
            f" ({d.get('prepare_seconds', 0):.1f} s), {d['daemons']} MPS control daemon(s),"
            f" {len(servers) if clients else '?'} MPS server(s) for the models' processes"
            + (f"; {skipped} mount(s) not bound: host path = container path" if skipped else "")
            + "."
        )
    return ["", *lines] if lines else []


def _cell_pct(p: dict[str, Any]) -> str:
    w = [x for x in p["within_slo_windows"] if not math.isnan(x)]
    spread = f" ({slo.fmt_pct(min(w))}-{slo.fmt_pct(max(w))})" if len(w) > 1 else ""
    return slo.fmt_pct(p["within_slo"]) + spread


def _points_table(points: list[dict[str, Any]], models: list[str]) -> str:
    head = "| load | mode | " + " | ".join(f"{m} within SLO % | {m} p99 ms | {m} n" for m in models)
    rows = [head + " |", "|---|---|" + "---|" * (3 * len(models))]
    by_key: dict[tuple[float, str], dict[str, dict[str, Any]]] = {}
    for p in points:
        by_key.setdefault((p["load"], p["mode"]), {})[p["model"]] = p
    order = {m: i for i, m in enumerate(MODE_LABELS)}
    for (load, mode), cells in sorted(
        by_key.items(), key=lambda k: (k[0][0], order.get(k[0][1], 9))
    ):
        parts = []
        for m in models:
            p = cells.get(m)
            parts += [_cell_pct(p), slo.fmt_ms(p["p99"]), str(p["requests"])] if p else ["", "", ""]
        rows.append(f"| {load:.2f} | {mode} | " + " | ".join(parts) + " |")
    return "\n".join(rows)


def plot(results: dict[str, Any], path: Path) -> bool:
    """SLO attainment and p99 against load, one column per model, one line per mode. False
    when matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(results["calibration"])
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 7), squeeze=False)
    by_mode: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for p in results["points"]:
        by_mode.setdefault(p["mode"], {}).setdefault(p["model"], []).append(p)
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        slo_ms = results["calibration"][model]["slo_seconds"] * 1e3
        for mode, per_model in by_mode.items():
            pts = sorted(per_model.get(model, []), key=lambda p: p["load"])
            if not pts:
                continue
            loads = [p["load"] for p in pts]
            label = MODE_LABELS.get(mode, mode)
            top.plot(loads, [100 * p["within_slo"] for p in pts], marker="o", label=label)
            p99 = [p["p99"] * 1e3 if math.isfinite(p["p99"]) else math.nan for p in pts]
            bottom.plot(loads, p99, marker="o", label=label)
        top.axhline(100 * TARGET, color="grey", linestyle="--", linewidth=1)
        top.set_ylim(max(0, top.get_ylim()[0]), 100.5)
        top.set_title(model)
        top.set_ylabel("% of requests within SLO")
        bottom.axhline(slo_ms, color="grey", linestyle="--", linewidth=1, label="SLO")
        bottom.set_yscale("log")
        bottom.set_ylabel("p99 latency, ms (log)")
        bottom.set_xlabel("load (fraction of solo capacity)")
    axes[1][0].legend(fontsize=8)
    meta = results["meta"]
    runs = len(meta.get("runs", [meta]))
    fig.suptitle(
        f"{meta['gpu']}, driver {meta['driver']}, {meta['date'][:10]}: SLO ="
        f" {meta['slo_multiple']:g} x solo p99" + (f", {runs} runs pooled" if runs > 1 else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(results: dict[str, Any], out: Path, name: str, png: bool = True) -> list[Path]:
    """results/<name>.json (raw), .md (tables) and .png (where matplotlib is importable)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(verdict.jsonable(results), indent=1) + "\n")
    paths[1].write_text(markdown(results))
    if png and plot(results, out / f"{name}.png"):
        paths.append(out / f"{name}.png")
    return paths


def _restore(value: Any) -> float:
    """A number read back from a results file: null was inf (missed) or NaN (no requests)."""
    return math.inf if value is None else float(value)


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs as one: each point's requests pooled (a request is within or outside the
    SLO of the run that measured it; loads are fractions of that run's own solo capacity), its
    windows those of every run, its percentiles over the pooled latencies."""
    pooled: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for run in runs:
        for p in run["points"]:
            pooled.setdefault((p["mode"], p["load"], p["model"]), []).append(p)
    points = []
    for (mode, load, model), parts in pooled.items():
        latencies = [_restore(x) / 1e3 for p in parts for x in p["latencies_ms"]]
        requests = sum(p["requests"] for p in parts)
        within = sum(_restore(p["within_slo"]) * p["requests"] for p in parts if p["requests"])
        points.append(
            {
                "mode": mode,
                "load": load,
                "model": model,
                "requests": requests,
                "missed": sum(p["missed"] for p in parts),
                "p50": slo.percentile(latencies, 50),
                "p99": slo.percentile(latencies, 99),
                "p999": slo.percentile(latencies, 99.9),
                "within_slo": within / requests if requests else math.nan,
                "within_slo_runs": [_restore(p["within_slo"]) for p in parts],
                "within_slo_windows": [_restore(w) for p in parts for w in p["within_slo_windows"]],
            }
        )
    first = runs[0]
    calibration = {
        model: {
            **{
                k: slo.mean(r["calibration"][model][k] for r in runs)
                for k in ("service_mean", "service_p99", "capacity_per_second", "slo_seconds")
            },
            "runs": [r["calibration"][model] for r in runs],
        }
        for model in first["calibration"]
    }
    meta = dict(first["meta"])
    meta["runs"] = [r["meta"] for r in runs]
    meta["wall_seconds"] = sum(r["meta"].get("wall_seconds", 0) for r in runs)
    mps: dict[str, Any] = {}
    for r in runs:
        for mode, limits in r["mps"].items():
            merged = mps.setdefault(mode, {"client_thread_percentage": {}, "runs": []})
            merged["runs"].append(limits)
            for m, pct in limits["client_thread_percentage"].items():
                merged["client_thread_percentage"].setdefault(m, []).append(pct)
    for merged in mps.values():
        merged["client_thread_percentage"] = {
            m: "/".join(map(str, v)) for m, v in merged["client_thread_percentage"].items()
        }
    results = {
        "meta": meta,
        "calibration": calibration,
        "points": points,
        "isolation": [dict(p, run=i + 1) for i, r in enumerate(runs) for p in r["isolation"]],
        "mps": mps,
        "workers": first["workers"],
    }
    for p in results["isolation"]:
        p.pop("latencies_ms", None)
        for key in ("p50", "p99", "p999", "within_slo"):
            p[key] = _restore(p[key])
        p["within_slo_windows"] = [_restore(w) for w in p["within_slo_windows"]]
    results["derived"] = derive(results)
    return results


def main(argv: list[str] | None = None) -> int:
    """Pool repeated runs (results JSON files of run.py) into one report; the calls of
    `run.py --study` into one study (verdict.merge)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--name", default="voice")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    args = parser.parse_args(argv)
    runs = []
    for path in args.runs:
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            parser.error(f"{path}: not a results file of run.py ({err})")
        if not isinstance(loaded, dict) or not isinstance(loaded.get("meta"), dict):
            parser.error(f"{path}: not a results file of run.py (no meta)")
        runs.append(loaded)
    studies = [r["meta"].get("study") == verdict.STUDY for r in runs]
    if any(studies):
        try:  # the whole report made once before a file is written: a bad file writes none
            results = verdict.merge(runs)
            verdict.markdown(verdict.with_derived(results))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            parser.error(f"the files are not calls of one study: {err!s}")
        paths = verdict.write(results, args.out, args.name, png=not args.no_plot)
        print(verdict.markdown(results))
    else:
        results = merge(runs)
        paths = write(results, args.out, args.name, png=not args.no_plot)
        print(markdown(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
