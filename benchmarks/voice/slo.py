"""The voice benchmark's pure parts: Poisson arrivals, the open-loop server, latency statistics,
SLO attainment, the highest passing load and the GPUs a mode needs. No torch, no GPU."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence

MISSED = math.inf  # latency of a request still unserved when the point gave up on it


def poisson_arrivals(rate_per_second: float, seconds: float, seed: int) -> list[float]:
    """Arrival offsets (s from the start) of a Poisson process of `rate_per_second` over
    [0, seconds): exponential gaps from a seeded generator, so a point is reproducible."""
    if rate_per_second <= 0 or seconds <= 0:
        return []
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_per_second)
    while t < seconds:
        out.append(t)
        t += rng.expovariate(rate_per_second)
    return out


def serve_open_loop(
    arrivals: Sequence[float],
    serve: Callable[[], None],
    now: Callable[[], float],
    wait_until: Callable[[float], None],
    give_up_at: float,
) -> list[float]:
    """Serve requests one at a time in arrival order (one model instance, FIFO queue).

    `now()` is seconds since the common start; a request's latency runs from its arrival, so
    queueing counts. Requests not started by `give_up_at` are MISSED: with `give_up_at` at
    least the SLO past the last arrival, each of them has already waited past the SLO."""
    latencies: list[float] = []
    for i, arrival in enumerate(arrivals):
        t = now()
        if t >= give_up_at:
            latencies.extend([MISSED] * (len(arrivals) - i))
            break
        if t < arrival:
            wait_until(arrival)
        serve()
        latencies.append(now() - arrival)
    return latencies


def fifo_latencies(arrivals: Sequence[float], service_seconds: Sequence[float]) -> list[float]:
    """What serve_open_loop measures for known service times (single server, FIFO)."""
    free_at = 0.0
    out = []
    for arrival, service in zip(arrivals, service_seconds, strict=True):
        free_at = max(free_at, arrival) + service
        out.append(free_at - arrival)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100): the smallest value with at least q % of the
    values at or below it. MISSED values sort last. NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    # q * n / 100, not q / 100 * n: 99.9 / 100 * 1000 is 999.0000000000001 (one rank high)
    rank = max(1, math.ceil(q * len(ordered) / 100 - 1e-9))
    return ordered[rank - 1]


def attainment(latencies: Sequence[float], slo_seconds: float) -> float:
    """Share of requests within the SLO (a MISSED request is outside). NaN for none."""
    if not latencies:
        return math.nan
    return sum(1 for x in latencies if x <= slo_seconds) / len(latencies)


def windows(
    arrivals: Sequence[float], latencies: Sequence[float], seconds: float, count: int
) -> list[list[float]]:
    """Latencies split into `count` equal windows of arrival time: repetitions within a point."""
    out: list[list[float]] = [[] for _ in range(count)]
    for arrival, latency in zip(arrivals, latencies, strict=True):
        out[min(count - 1, int(arrival / seconds * count))].append(latency)
    return out


def summarize(
    arrivals: Sequence[float],
    latencies: Sequence[float],
    slo_seconds: float,
    seconds: float,
    window_count: int = 2,
) -> dict[str, float | int | list[float]]:
    """One point's numbers: requests, p50/p99/p99.9 (s, inf when missed), share within the SLO
    overall and per window (the spread between windows is the point's repeatability)."""
    return {
        "requests": len(latencies),
        "missed": sum(1 for x in latencies if x == MISSED),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "p999": percentile(latencies, 99.9),
        "within_slo": attainment(latencies, slo_seconds),
        "within_slo_windows": [
            attainment(w, slo_seconds) for w in windows(arrivals, latencies, seconds, window_count)
        ],
    }


def slo_seconds(solo_latencies: Sequence[float], multiple: float) -> float:
    """The SLO of a model: `multiple` x its solo p99 with no queueing (closed loop)."""
    return multiple * percentile(solo_latencies, 99)


def highest_passing_load(within_by_load: dict[float, float], target: float = 0.99) -> float | None:
    """The highest tested load below the first failing one (a lucky pass above a failure does
    not count); None when even the lowest load fails."""
    best = None
    for load in sorted(within_by_load):
        within = within_by_load[load]
        if math.isnan(within) or within < target:
            break
        best = load
    return best


def together_passing(
    within_by_model_load: dict[str, dict[float, float]], target: float = 0.99
) -> float | None:
    """Highest load at which every model passes (all models run at the same load fraction)."""
    loads = set.intersection(*(set(v) for v in within_by_model_load.values()))
    worst = {load: min(v[load] for v in within_by_model_load.values()) for load in sorted(loads)}
    return highest_passing_load(worst, target)


def gpus_solo(traffic_load: dict[str, float], passing_load: dict[str, float | None]) -> float:
    """GPUs for one pod per GPU: each model's traffic (in solo capacities) over what one GPU
    carries within SLO, rounded up per model. inf when a model passes at no load."""
    total = 0
    for model, load in traffic_load.items():
        limit = passing_load.get(model)
        if not limit:
            return math.inf
        total += math.ceil(load / limit - 1e-9)
    return total


def gpus_together(traffic_load: dict[str, float], passing_load: float | None) -> float:
    """GPUs when every GPU runs one instance of each model at a common load: the most loaded
    model decides. inf when the mode passes at no tested load."""
    if not passing_load:
        return math.inf
    return math.ceil(max(traffic_load.values()) / passing_load - 1e-9)


def weighted_percentages(weights: dict[str, float], floor: int = 5) -> dict[str, int]:
    """MPS active thread percentages proportional to `weights` (each model's solo GPU time),
    at least `floor` each, summing to at most 100."""
    total = sum(weights.values())
    raw = {m: max(floor, math.floor(100 * w / total)) for m, w in weights.items()}
    while sum(raw.values()) > 100:
        biggest = max(raw, key=lambda m: raw[m])
        raw[biggest] -= 1
    return raw


def plan_seconds(
    models: int,
    loads: int,
    solo_seconds: float,
    together_modes: int,
    point_seconds: float,
    isolation_modes: int,
    isolation_seconds: float,
    drain_seconds: float,
    calibrate_seconds: float,
    startups: int,
    startup_seconds: float,
) -> dict[str, float]:
    """The budget arithmetic printed before a run: seconds per phase and in all."""
    phases = {
        "startup": startups * startup_seconds,
        "calibrate": models * calibrate_seconds,
        "solo": models * loads * (solo_seconds + drain_seconds),
        "together": together_modes * loads * (point_seconds + drain_seconds),
        "isolation": isolation_modes * (isolation_seconds + drain_seconds),
    }
    phases["total"] = sum(phases.values())
    return phases


def fmt_ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "missed"
    return f"{seconds * 1e3:.1f}"


def fmt_pct(x: float) -> str:
    """A fraction as a per cent with one decimal ('-' for none)."""
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def fmt_load(x: float | None) -> str:
    return "none" if x is None else f"{x:.2f}"


def fmt_gpus(x: float) -> str:
    return "-" if math.isinf(x) else f"{x:g}"


def mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else math.nan


def share_request_percent(busy_fraction: float, step: int, floor: int | None = None) -> int:
    """A share claim's `sm` request for a model that keeps `busy_fraction` of the GPU busy:
    the share device's sm requestPolicy read as the scheduler applies it (nodeagent.dra.capacity:
    min and step `step` percent, max 100): the demand in percent rounded up to the step."""
    percent = math.ceil(100 * max(busy_fraction, 0.0) / step - 1e-9) * step
    return min(100, max(floor or step, percent))


def share_requests(demand: dict[str, float], step: int) -> tuple[dict[str, int], bool]:
    """Each model's `sm` request from its demand (share_request_percent), and whether they had
    to be trimmed to sum to at most 100 (the scheduler would not put them on one device):
    the largest loses a step at a time, none below one step."""
    requests = {m: share_request_percent(d, step) for m, d in demand.items()}
    trimmed = False
    while sum(requests.values()) > 100 and max(requests.values()) > step:
        largest = max(requests, key=lambda m: requests[m])
        requests[largest] -= step
        trimmed = True
    return requests, trimmed


def round_order(modes: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """The modes interleaved: every mode once a round, in the given order, round after round
    (1, solo), (1, time-slicing), ..., (2, solo), ... so a drift of the machine falls on each
    mode alike."""
    return [(r, mode) for r in range(1, rounds + 1) for mode in modes]


def spread(values: Iterable[float]) -> dict[str, float]:
    """Mean, min, max and sample standard deviation (0 for one value) of the finite values;
    NaN for none."""
    items = [v for v in values if not math.isnan(v)]
    if not items:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "stdev": math.nan, "n": 0}
    m = sum(items) / len(items)
    var = sum((v - m) ** 2 for v in items) / (len(items) - 1) if len(items) > 1 else 0.0
    return {
        "mean": m,
        "min": min(items),
        "max": max(items),
        "stdev": math.sqrt(var),
        "n": len(items),
    }
