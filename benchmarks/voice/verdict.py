"""The burst shares study's report (study.py): each point's mean and spread over its rounds, the
verdict per mode, the target line, a Markdown table, the raw JSON and a plot; and the merge of
several calls' results into one. Pure but for the files it writes.

A point is (mode, load, model); its rounds are the calls' rounds at that load (each within or
outside the SLO of the call that measured it). The verdict reads the mean over rounds:

- per mode, the highest load at which every model holds >= 99 % within SLO (a pass above a
  failing load does not count), each model's figure against its alone figure (points), and the
  GPUs the traffic needs (each model at the highest load it holds alone; slo.gpus_*);
- the target, through dra-burst (DRA shares with the default limit): at the highest load where
  every model alone holds >= 99 %, the models together also hold >= 99 %; at 0.6 and 0.8 every
  model is at or above its alone figure minus 2 points. Met: N GPUs -> 1 at no loss of SLO.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import slo

STUDY = "burst-shares"
TARGET = 0.99
TARGET_MODE = "dra-burst"
TARGET_LOADS = (0.6, 0.8)
ALLOWED_DROP = 0.02  # points below alone, at TARGET_LOADS
PCT_ENV, PRIORITY_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY"
MODE_LABELS = {
    "solo": "alone (1 pod per GPU)",
    "time-slicing": "time-slicing",
    "dra-capped": "DRA shares, limit = request",
    "dra-burst": "DRA shares, default limit (burst)",
    "dra-low": "DRA shares, burst, embedder priority low",
    "mps": "device-plugin MPS, uncapped",
}


def cells(points: list[dict[str, Any]]) -> dict[tuple[str, float, str], dict[str, Any]]:
    """(mode, load, model) -> the within-SLO share's spread over the rounds (slo.spread), the
    p99's (ms, inf for missed requests), and the requests in all."""
    rounds: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for p in points:
        rounds.setdefault((p["mode"], float(p["load"]), p["model"]), []).append(p)
    out = {}
    for key, rows in rounds.items():
        out[key] = {
            "within": slo.spread(_num(r["within_slo"]) for r in rows),
            "p99_ms": slo.spread(_num(r["p99"]) * 1e3 for r in rows),
            "requests": sum(int(r["requests"]) for r in rows),
            "rounds": len(rows),
        }
    return out


def _num(value: Any) -> float:
    """A number as written to JSON: null was inf (missed) or NaN (no requests): inf."""
    return math.inf if value is None else float(value)


def means(points: list[dict[str, Any]]) -> dict[str, dict[str, dict[float, float]]]:
    """mode -> model -> load -> mean share within SLO over the rounds."""
    out: dict[str, dict[str, dict[float, float]]] = {}
    for (mode, load, model), c in cells(points).items():
        out.setdefault(mode, {}).setdefault(model, {})[load] = c["within"]["mean"]
    return out


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """The verdict per mode and the target (module docstring)."""
    table = means(results["points"])
    models = [m["name"] for m in results["meta"]["models"]]
    solo = table.get("solo", {})
    solo_passing = {m: slo.highest_passing_load(solo.get(m, {}), TARGET) for m in models}
    reference = slo.together_passing(solo) if len(solo) == len(models) else None
    traffic = {m: load for m, load in solo_passing.items() if load}
    complete = len(traffic) == len(models)
    modes: dict[str, Any] = {}
    for mode, per_model in table.items():
        if mode == "solo":
            passing, gpus = (
                reference,
                slo.gpus_solo(traffic, solo_passing) if complete else math.inf,
            )
        else:
            whole = len(per_model) == len(models)
            passing = slo.together_passing(per_model, TARGET) if whole else None
            gpus = slo.gpus_together(traffic, passing) if complete else math.inf
        versus = {
            str(load): {
                m: per_model[m][load] - solo[m][load]
                for m in models
                if load in per_model.get(m, {}) and load in solo.get(m, {})
            }
            for load in sorted({x for v in per_model.values() for x in v})
        }
        modes[mode] = {"passing_load": passing, "gpus": gpus, "versus_alone": versus}
    return {
        "target": TARGET,
        "solo_passing_load": solo_passing,
        "reference_load": reference,
        "traffic_load": traffic,
        "modes": modes,
        "goal": goal(table, models, reference),
    }


def goal(
    table: dict[str, dict[str, dict[float, float]]], models: list[str], reference: float | None
) -> dict[str, Any]:
    """The target through TARGET_MODE: each check True, False or None (not measured), and the
    outcome: met (every check True), missed (one False) or not judged."""
    burst, solo = table.get(TARGET_MODE, {}), table.get("solo", {})
    checks: dict[str, bool | None] = {}
    notes: list[str] = []
    if reference is None:
        checks["reference"] = None
        notes.append("no load at which every model alone holds >= 99 %")
    else:
        worst = [burst.get(m, {}).get(reference, math.nan) for m in models]
        ok = None if any(math.isnan(w) for w in worst) else min(worst) >= TARGET
        checks[f"{reference:g}"] = ok
        notes.append(
            f"at {reference:.2f}, where every model alone holds >= 99 %, the worst model together"
            f" {slo.fmt_pct(min(worst)) if ok is not None else 'not measured'} %"
            + ("" if ok is None else f" ({'>=' if ok else '<'} 99)")
        )
    for load in TARGET_LOADS:
        pairs = [(m, burst.get(m, {}).get(load), solo.get(m, {}).get(load)) for m in models]
        if any(b is None or s is None for _, b, s in pairs):
            checks[f"{load:g}"] = None
            notes.append(f"at {load:.2f} not measured")
            continue
        ok = all(
            b >= s - ALLOWED_DROP - 1e-9 for _, b, s in pairs if b is not None and s is not None
        )
        checks[f"{load:g}"] = ok
        notes.append(
            f"at {load:.2f} "
            + ", ".join(f"{m} {slo.fmt_pct(b)} vs {slo.fmt_pct(s)} alone" for m, b, s in pairs)  # type: ignore[arg-type]
            + f" ({'each' if ok else 'not each'} >= alone - 2)"
        )
    values = list(checks.values())
    outcome = "met" if all(v is True for v in values) else (
        "missed" if any(v is False for v in values) else "not judged"
    )  # fmt: skip
    return {"checks": checks, "outcome": outcome, "notes": notes}


def target_line(results: dict[str, Any]) -> str:
    g = results["derived"]["goal"]
    n = len(results["meta"]["models"])
    claim = f"{n} GPUs -> 1 at no loss of SLO"
    verdicts = {"met": claim, "missed": f"not {claim}", "not judged": f"{claim}: not judged"}
    return (
        f"Target ({MODE_LABELS[TARGET_MODE]}): "
        + "; ".join(g["notes"])
        + f" -> **{verdicts[g['outcome']]}**."
    )


def with_derived(results: dict[str, Any]) -> dict[str, Any]:
    results["derived"] = derive(results)
    return results


def _cell(spread: dict[str, float], scale: float = 100.0) -> str:
    """'mean (min-max)' over the rounds; a p99 (scale 1, ms) of a round that missed requests
    is 'missed', and makes the cell 'min-missed'."""
    if not spread["n"]:
        return "-"
    if math.isinf(spread["min"]):
        return "missed"
    if math.isinf(spread["max"]):
        return f"{scale * spread['min']:.1f}-missed"
    body = f"{scale * spread['mean']:.1f}"
    if spread["n"] > 1:
        body += f" ({scale * spread['min']:.1f}-{scale * spread['max']:.1f})"
    return body


def markdown(results: dict[str, Any]) -> str:
    """The report: the calls, the SLOs, the shares' sizes, the verdict, the target, the points."""
    meta, derived = results["meta"], results["derived"]
    calls = meta.get("calls", [meta])
    models = [m["name"] for m in meta["models"]]
    lines = [
        "# Three models, one GPU: the burst shares study",
        "",
        f"GPU: {meta['gpu']}, driver {meta['driver']}, CUDA {meta['cuda']}.",
        f"SLO = {meta['slo_multiple']:g} x each model's p99 alone at load {meta['slo_load']:g}"
        " (open loop, queueing counted), measured in the same call; loads are fractions of"
        " each model's solo capacity (closed loop, the same call).",
    ]
    for i, c in enumerate(calls):
        lines.append(
            f"Call {i + 1}: {c['date']}, loads {c['loads']}, {c.get('rounds_done', 0)} of"
            f" {c['rounds']} rounds, points {c['point_seconds']:g} s, seed {c['seed']},"
            f" {c.get('wall_seconds', 0):.0f} s"
            + (" (interrupted)" if c.get("interrupted") else "")
            + "."
        )
    lines += [
        "Each cell: the mean over the rounds, (min-max) over the rounds.",
        "",
        "| call | model | service mean ms | capacity /s | p99 alone at SLO load ms | SLO ms |",
        "|---|---|---|---|---|---|",
    ]
    for i, cal in enumerate(results.get("calibrations", [results["calibration"]])):
        for m in models:
            c = cal.get(m, {})
            lines.append(
                f"| {i + 1} | {m} | {slo.fmt_ms(c.get('service_mean', math.nan))} |"
                f" {c.get('capacity_per_second', math.nan):.1f} |"
                f" {slo.fmt_ms(c.get('solo_p99_at_slo_load', math.nan))} |"
                f" {slo.fmt_ms(c.get('slo_seconds', math.nan))} |"
            )
    lines += ["", "| load | model | demand alone % (source) | sm request % |", "|---|---|---|---|"]
    for load, s in sorted(results.get("shares", {}).items(), key=lambda kv: float(kv[0])):
        for m in models:
            lines.append(
                f"| {float(load):.2f} | {m} | {100 * s['demand'][m]:.1f} ({s['source'][m]}) |"
                f" {s['sm_request_percent'][m]}{' (trimmed)' if s.get('trimmed') else ''} |"
            )
    lines += [
        "",
        "| mode | highest load, every model >= 99 % | GPUs for the traffic |",
        "|---|---|---|",
    ]
    for mode in _ordered(set(derived["modes"]) | set(meta.get("modes", []))):
        d = derived["modes"].get(mode)
        if d is None:  # refused at prepare (below), or not reached
            lines.append(f"| {MODE_LABELS.get(mode, mode)} | not measured | - |")
            continue
        lines.append(
            f"| {MODE_LABELS.get(mode, mode)} | {slo.fmt_load(d['passing_load'])} | {slo.fmt_gpus(d['gpus'])} |"
        )
    lines += [
        "",
        "Traffic: each model at the highest load it holds alone ("
        + ", ".join(f"{m} {slo.fmt_load(v)}" for m, v in derived["solo_passing_load"].items())
        + ").",
        *(f"Refused: {k}: {v}" for k, v in results.get("refused", {}).items()),
        *_claims_lines(results),
        "",
        target_line(results),
        "",
        _points_table(results, models),
    ]
    return "\n".join(lines) + "\n"


def _claims_lines(results: dict[str, Any]) -> list[str]:
    """What each DRA mode's claims asked for and what their clients' environment got: the
    request, the limit (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and the priority."""
    rows = []
    for key, made in results.get("mps", {}).items():
        asked = {a["model"]: a for a in made.get("shares", [])}
        for claim in made.get("claims", []):
            env, a = claim.get("env", {}), asked.get(claim["model"], {})
            rows.append(
                f"| {key} | {claim['model']} | {a.get('sm_request_percent', '-')} |"
                f" {env.get(PCT_ENV, '-')} | {env.get(PRIORITY_ENV, '-')} |"
            )
    if not rows:
        return []
    return [
        "",
        f"| claims (mode@load) | model | sm request % | client {PCT_ENV} | client {PRIORITY_ENV} |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _ordered(modes: Any) -> list[str]:
    order = {m: i for i, m in enumerate(MODE_LABELS)}
    return sorted(modes, key=lambda m: order.get(m, len(order)))


def _points_table(results: dict[str, Any], models: list[str]) -> str:
    head = "| load | mode | " + " | ".join(
        f"{m} within SLO % | {m} vs alone | {m} p99 ms" for m in models
    )
    rows = [head + " |", "|---|---|" + "---|" * (3 * len(models))]
    table = cells(results["points"])
    versus = results["derived"]["modes"]
    for load in sorted({k[1] for k in table}):
        for mode in _ordered({k[0] for k in table if k[1] == load}):
            parts = []
            for m in models:
                c = table.get((mode, load, m))
                if c is None:
                    parts += ["", "", ""]
                    continue
                delta = versus[mode]["versus_alone"].get(str(load), {}).get(m)
                parts += [
                    _cell(c["within"]),
                    "" if mode == "solo" or delta is None else f"{100 * delta:+.1f}",
                    _cell(c["p99_ms"], 1),
                ]
            rows.append(f"| {load:.2f} | {mode} | " + " | ".join(parts) + " |")
    return "\n".join(rows)


def jsonable(value: Any) -> Any:
    """inf/NaN (missed requests, empty points) as null: strict JSON."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def plot(results: dict[str, Any], path: Path) -> bool:
    """Share within SLO against load, one panel per model, one line per mode (the mean, bars
    from the rounds' min to max). False where matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = [m["name"] for m in results["meta"]["models"]]
    table = cells(results["points"])
    fig, axes = plt.subplots(1, len(models), figsize=(4.4 * len(models), 4.2), squeeze=False)
    for col, model in enumerate(models):
        ax = axes[0][col]
        for mode in _ordered({k[0] for k in table}):
            pts = sorted(
                (k[1], c["within"]) for k, c in table.items() if k[0] == mode and k[2] == model
            )
            if not pts:
                continue
            x = [load for load, _ in pts]
            y = [100 * s["mean"] for _, s in pts]
            err = [
                [100 * (s["mean"] - s["min"]) for _, s in pts],
                [100 * (s["max"] - s["mean"]) for _, s in pts],
            ]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=MODE_LABELS.get(mode, mode))
        ax.axhline(100 * TARGET, color="grey", linestyle="--", linewidth=1)
        ax.set_title(model)
        ax.set_xlabel("load (fraction of solo capacity)")
        ax.set_ylabel("% of requests within SLO (mean, min-max)")
    axes[0][0].legend(fontsize=7)
    meta = results["meta"]
    fig.suptitle(
        f"{meta['gpu']}, driver {meta['driver']}: SLO = {meta['slo_multiple']:g} x p99 alone at"
        f" load {meta['slo_load']:g}; {len(meta.get('calls', [meta]))} call(s)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(results: dict[str, Any], out: Path, name: str, png: bool = True) -> list[Path]:
    """<name>.json (raw, with the verdict), .md (the report) and .png (with matplotlib)."""
    with_derived(results)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(jsonable(results), indent=1) + "\n")
    paths[1].write_text(markdown(results))
    if png and plot(results, out / f"{name}.png"):
        paths.append(out / f"{name}.png")
    return paths


def merge(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Several calls' results as one: their points (each tagged with its call; its rounds
    count as more rounds of its load), their calibrations and SLOs side by side, their shares
    by load (a load measured twice keeps the later call's sizing), their refusals. Raises
    ValueError (one sentence) for a file of another study or other models."""
    first = calls[0]
    models = [m["name"] for m in first["meta"]["models"]]
    for i, c in enumerate(calls):
        meta = c.get("meta") or {}
        if meta.get("study") != STUDY:
            raise ValueError(f"file {i + 1} is not a result of run.py --study")
        missing = [k for k in ("models", "loads", "slo_multiple", "slo_load") if k not in meta]
        missing += [k for k in ("points", "calibration") if k not in c]
        if missing:
            raise ValueError(f"file {i + 1} lacks {', '.join(missing)}: not a whole call")
        if [m["name"] for m in c["meta"]["models"]] != models:
            raise ValueError(f"file {i + 1} measured other models than file 1 ({models})")
        for key in ("slo_multiple", "slo_load"):
            if c["meta"][key] != first["meta"][key]:
                raise ValueError(f"file {i + 1} took another {key} than file 1: one SLO rule")
    meta = dict(first["meta"])
    meta["calls"] = [c["meta"] for c in calls]
    meta["loads"] = sorted({x for c in calls for x in c["meta"]["loads"]})
    shares: dict[str, Any] = {}
    for c in calls:
        shares.update(c.get("shares", {}))
    return {
        "meta": meta,
        "calibration": first["calibration"],
        "calibrations": [c["calibration"] for c in calls],
        "points": [dict(p, call=i + 1) for i, c in enumerate(calls) for p in c["points"]],
        "slo_points": [
            dict(p, call=i + 1) for i, c in enumerate(calls) for p in c.get("slo_points", [])
        ],
        "shares": shares,
        "refused": {
            f"call {i + 1}: {k}": v
            for i, c in enumerate(calls)
            for k, v in c.get("refused", {}).items()
        },
        "mps": {
            f"call {i + 1}: {k}": v
            for i, c in enumerate(calls)
            for k, v in c.get("mps", {}).items()
        },
        "workers": first.get("workers", {}),
    }
