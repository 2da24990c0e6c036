"""Consolidation study (GPU machine): a voice-AI pipeline on one GPU at the same latency SLO.

Three models, each served by its own process, one request at a time, with open-loop Poisson
arrivals (seeded) at fractions of the model's solo capacity; latency counts queueing. Modes:
each model alone (one pod per GPU); all together under plain time-slicing; all together under
MPS started by nodeagent, with 100 // n % of the threads each and with a split weighted by
each model's solo GPU time (its SM activity alone). Per mode: the highest load at which every model keeps
>= 99 % of its requests within its SLO (a fixed multiple of its solo p99 with no queueing),
and the GPUs that mode needs for the same traffic. Then isolation: a batch job in an unbounded
loop beside the light models, time-sliced and under MPS with limits.

Through the product (issue 38): `dra-shares`, the models as the clients of one MPS share claim
each, prepared by nodeagent's own DRA driver through the fake kubelet (dra_shares.py), each
model process started with exactly its claim's CDI environment; `dra-per-claim`, the design
before it (a control daemon per claim), or the driver with the settings of --per-claim-settings.
`--study` is issue 45's study (study.py): the SLO from each model's p99 alone at a low load,
the modes interleaved in rounds (solo, time-slicing, DRA shares capped at their request, with
the default limit, with the embedder at low priority, the device-plugin MPS path uncapped),
the shares sized from each model's demand; one call of under 9 minutes does a subset of the
loads (`--loads 0.6`), `report.py A.json B.json ...` merges the calls. `--simulate h200
--device cpu` runs the DRA and MPS parts on the emulator with the tests' fake MPS daemon (no
GPU).

Run: python benchmarks/voice/run.py [--quick | --study [--dry-run]] (see --help); writes
results/voice.{json,md,png} (--name for another stem); `python benchmarks/voice/report.py A.json
B.json` pools runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dra_shares
import report
import slo

HERE = Path(__file__).resolve().parent
DEFAULT_MODELS = ("asr", "tts", "embed")
DEFAULT_MODES = ("solo", "time-slicing", "mps-equal", "mps-weighted")
DRA_MODES = ("dra-shares", "dra-per-claim")
MODES = (*DEFAULT_MODES, *DRA_MODES)
# Issue 45's study (study.py): its modes, in each round's order
STUDY_MODES = ("solo", "time-slicing", "dra-capped", "dra-burst", "dra-low", "mps")
STUDY_DEFAULTS: dict[str, Any] = {
    "loads": (0.6,), "point_seconds": 10.0, "calibrate_seconds": 3.0, "slo_multiple": 3.0,
    "budget_seconds": 540.0, "modes": ",".join(STUDY_MODES),
}  # fmt: skip


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str
    overrides: dict[str, Any] = field(default_factory=dict)


def parse_model(text: str) -> ModelSpec:
    """'asr' or 'NAME=KIND[:key=value,...]' (values as JSON where they parse)."""
    import models

    name, _, rest = text.partition("=")
    kind, _, options = (rest or name).partition(":")
    if kind not in models.BUILDERS or kind in ("hog",):
        raise argparse.ArgumentTypeError(
            f"unknown model kind {kind!r}; one of {', '.join(sorted(set(models.BUILDERS) - {'hog'}))}"
        )
    overrides: dict[str, Any] = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"model option {item!r} is not key=value")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return ModelSpec(name, kind, overrides)


def parse_loads(text: str) -> tuple[float, ...]:
    try:
        loads = tuple(sorted(float(x) for x in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"loads {text!r} are not numbers like 0.2,0.4") from None
    if not loads or not all(0 < x < 1.5 for x in loads):
        raise argparse.ArgumentTypeError("loads are fractions of solo capacity in (0, 1.5)")
    return loads


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~3-minute check (2 loads, short points)")
    p.add_argument(
        "--study",
        action="store_true",
        help="issue 45's burst shares study (study.py), one call: modes"
        f" {','.join(STUDY_MODES)} interleaved in --rounds rounds at --loads (default 0.6),"
        " the SLO from each model alone at --slo-load; --dry-run prints the plan",
    )
    p.add_argument("--dry-run", action="store_true", help="--study: print the plan, run nothing")
    p.add_argument("--rounds", type=int, default=3, help="--study: rounds of the modes (3)")
    p.add_argument(
        "--slo-load", type=float, default=0.1, help="--study: the load of the SLO point (0.1)"
    )
    p.add_argument(
        "--slo-seconds", type=float, default=20.0, help="--study: seconds of each SLO point (20)"
    )
    p.add_argument(
        "--min-requests",
        type=int,
        help="each point lasts until every model has had this many arrivals (its seeded"
        " Poisson stream decides: exact), at least --point-seconds / --solo-seconds (0: off)",
    )
    p.add_argument(
        "--simulate",
        metavar="SPEC",
        help="the DRA modes on the emulator (an emulated node, h200) with the tests' fake MPS"
        " daemon: a dry run of the DRA path, with --device cpu",
    )
    p.add_argument(
        "--share-percent",
        type=int,
        default=30,
        help="each model's share claim: percent of the GPU's SMs (a multiple of 5; 30)",
    )
    p.add_argument(
        "--share-memory", default="16Gi", help="each model's share claim: its memory (16Gi)"
    )
    p.add_argument(
        "--settings",
        metavar="FILE",
        help="nodeagent settings file for the DRA driver of dra-shares (default: its defaults)",
    )
    p.add_argument(
        "--per-claim-settings",
        metavar="FILE",
        help="nodeagent settings under which the driver runs a daemon per claim: dra-per-claim"
        " then goes through the driver; without it, a daemon per claim as the driver started"
        " them before issue 38 (nodeagent's MpsDaemon each)",
    )
    p.add_argument(
        "--model",
        action="append",
        type=parse_model,
        dest="models",
        help="NAME or NAME=KIND:key=value,... (config overrides); repeat; default asr, tts, embed",
    )
    p.add_argument(
        "--loads", type=parse_loads, help="fractions of solo capacity (default 0.15,0.3,0.45,0.6)"
    )
    p.add_argument("--solo-seconds", type=float, help="seconds per solo point (default 10)")
    p.add_argument(
        "--point-seconds", type=float, help="seconds per point of a together mode (default 22)"
    )
    p.add_argument(
        "--isolation-seconds", type=float, help="seconds per isolation point (default 15)"
    )
    p.add_argument(
        "--isolation-load",
        type=float,
        help="light models' load beside the batch job (default: the lowest load)",
    )
    p.add_argument(
        "--calibrate-seconds", type=float, help="closed-loop seconds per model (default 3)"
    )
    p.add_argument(
        "--slo-multiple",
        type=float,
        help="SLO = this x solo p99 with no queueing (5); --study: x solo p99 at --slo-load (3)",
    )
    p.add_argument(
        "--modes",
        help=f"subset of {','.join(MODES)} (default {','.join(DEFAULT_MODES)};"
        f" --study: {','.join(STUDY_MODES)})",
    )
    p.add_argument("--no-isolation", action="store_true")
    p.add_argument(
        "--idle",
        choices=("spin", "sleep"),
        default="spin",
        help="how an idle worker waits for the next arrival (spin: its CPU stays awake)",
    )
    p.add_argument(
        "--budget-seconds",
        type=float,
        help="skip a later mode (--study: round) that would not finish within this (560;"
        " --study: 540)",
    )
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default="voice", help="file stem of the results (voice)")
    p.add_argument(
        "--device",
        default="cuda",
        help="torch device of the workers (cuda; cpu for the fake model)",
    )
    p.add_argument(
        "--mps-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "voice-mps",
        help="MPS pipe and log directories go under it",
    )
    args = p.parse_args(argv)
    quick = args.quick
    if quick and args.study:
        p.error("--quick and --study are two different plans: choose one")
    defaults: dict[str, Any] = {
        "loads": (0.2, 0.4) if quick else (0.15, 0.3, 0.45, 0.6),
        "solo_seconds": 4.0 if quick else 10.0,
        "point_seconds": 8.0 if quick else 22.0,
        "isolation_seconds": 6.0 if quick else 15.0,
        "calibrate_seconds": 2.0 if quick else 3.0,
        "models": [ModelSpec(m, m) for m in DEFAULT_MODELS],
        "modes": ",".join(DEFAULT_MODES),
        "min_requests": 0,
        "budget_seconds": 560.0,
    }
    defaults["slo_multiple"] = 5.0
    if args.study:
        defaults.update(STUDY_DEFAULTS)
        args.no_isolation = True
    elif args.dry_run:
        p.error("--dry-run prints the plan of --study: give --study")
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.min_requests < 0:
        p.error("--min-requests is a number of requests, 0 or more")
    if not 5 <= args.share_percent <= 100 or args.share_percent % 5:
        p.error("--share-percent is a multiple of 5 in 5-100 (the share device's request policy)")
    if args.share_percent * len(args.models) > 100:
        p.error(
            f"{len(args.models)} shares of {args.share_percent} % do not fit one GPU (100 %):"
            " the scheduler would not put them on one device"
        )
    modes = tuple(m for m in args.modes.split(",") if m)
    known = STUDY_MODES if args.study else MODES
    unknown = set(modes) - set(known)
    if unknown:
        p.error(f"unknown modes {sorted(unknown)}; choose from {','.join(known)}")
    if "solo" not in modes:
        p.error("the solo mode is the baseline every other mode is compared with: keep it")
    if args.simulate and args.device.startswith("cuda"):
        p.error("--simulate runs the DRA path on the emulator: with --device cpu (fake models)")
    if args.study:
        study_checks(p, args)
        modes = tuple(m for m in STUDY_MODES if m in modes)  # a round's order: solo first
        if not args.device.startswith("cuda") and not args.simulate:
            modes = tuple(m for m in modes if m in ("solo", "time-slicing"))
    elif not args.device.startswith("cuda"):
        modes = tuple(m for m in modes if not m.startswith("mps"))  # MPS needs a GPU
        if not args.simulate:  # ... or the emulator and the fake MPS daemon
            modes = tuple(m for m in modes if m not in DRA_MODES)
    args.modes = modes
    names = [m.name for m in args.models]
    if len(set(names)) != len(names):
        p.error(f"model names given twice: {names}")
    if args.isolation_load is None:
        args.isolation_load = args.loads[0]
    return args


def study_checks(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--study's own numbers, each refused in one sentence (exit 2)."""
    if args.rounds < 1:
        p.error("--rounds is a number of rounds, 1 or more (3 for the study's spread)")
    if not 0 < args.slo_load < 1:
        p.error("--slo-load is a fraction of solo capacity in (0, 1), low: 0.1")
    if args.slo_seconds <= 0 or args.point_seconds <= 0 or args.calibrate_seconds <= 0:
        p.error("--slo-seconds, --point-seconds and --calibrate-seconds are seconds above 0")
    if args.slo_multiple <= 1:
        p.error("--slo-multiple is above 1: the SLO is a multiple of the p99 alone")


class Worker:
    """A worker process and a reader thread that sorts its stdout into replies and log lines."""

    def __init__(
        self, spec: ModelSpec, env: dict[str, str], device: str, idle: str, cpus: list[int]
    ) -> None:
        self.name = spec.name
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "worker.py"),
                "--kind",
                spec.kind,
                "--overrides",
                json.dumps(spec.overrides),
                "--device",
                device,
                "--warmup-seconds",
                "3" if device.startswith("cuda") else "0",
                "--idle",
                idle,
                "--cpus",
                ",".join(map(str, cpus)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            bufsize=1,
        )
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                self.replies.put(json.loads(line[3:]))
            else:
                sys.stderr.write(f"[{self.name}] {line}")
        self.replies.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout_seconds: float) -> dict[str, Any]:
        try:
            message = self.replies.get(timeout=timeout_seconds)
        except queue.Empty:
            raise SystemExit(f"worker {self.name}: no answer in {timeout_seconds:.0f} s") from None
        if message is None:
            raise SystemExit(f"worker {self.name} exited (code {self.proc.wait()})")
        if "error" in message:
            raise SystemExit(f"worker {self.name}: {message['error']}")
        return message

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send({"cmd": "quit"})
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cpu_sets(count: int, per_worker: int = 2) -> list[list[int]]:
    """Two CPUs of its own for each worker (the first two stay for the orchestrator and the
    MPS server); no pinning where there are too few."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 + count * per_worker:
        return [[] for _ in range(count)]
    return [cpus[2 + i * per_worker : 2 + (i + 1) * per_worker] for i in range(count)]


def start_pool(
    specs: list[ModelSpec],
    env: dict[str, str],
    args: argparse.Namespace,
    per_model_env: dict[str, dict[str, str]] | None = None,
    cpus: list[list[int]] | None = None,
) -> dict[str, Worker]:
    """One worker per spec, started (not waited for): `cpus` per spec (default: two CPUs of
    its own each, cpu_sets)."""
    started: dict[str, Worker] = {}
    try:
        for spec, pinned in zip(specs, cpus or cpu_sets(len(specs)), strict=True):
            started[spec.name] = Worker(
                spec,
                dict(env, **(per_model_env or {}).get(spec.name, {})),
                args.device,
                args.idle,
                pinned,
            )
    except BaseException:
        close_pool(started)
        raise
    return started


def await_pool(pool: dict[str, Worker]) -> dict[str, dict[str, Any]]:
    """Each worker's ready message, once it has built and warmed up its model."""
    return {name: w.receive(timeout_seconds=300) for name, w in pool.items()}


def close_pool(pool: dict[str, Worker]) -> None:
    for w in pool.values():
        w.close()


@contextlib.contextmanager
def workers(
    specs: list[ModelSpec],
    env: dict[str, str],
    args: argparse.Namespace,
    per_model_env: dict[str, dict[str, str]] | None = None,
) -> Iterator[tuple[dict[str, Worker], dict[str, dict[str, Any]]]]:
    """Start one worker per spec (in parallel), wait until each has built and warmed up."""
    started = start_pool(specs, env, args, per_model_env)
    try:
        yield started, await_pool(started)
    finally:
        close_pool(started)


def run_point(
    pool: dict[str, Worker],
    rates: dict[str, float],
    seconds: float,
    seeds: dict[str, int],
    drain: dict[str, float],
    hog: Worker | None = None,
) -> dict[str, dict[str, Any]]:
    """One load point: the named workers serve their Poisson arrivals from a common start
    (and the batch job loops beside them). Returns each model's arrivals and latencies."""
    start = time.time() + 0.2
    give_up = {name: seconds + drain[name] for name in rates}
    if hog is not None:  # from now until the light models' last give-up
        now = time.time()
        hog.send({"cmd": "hog", "start": now, "seconds": start - now + max(give_up.values())})
    for name, rate in rates.items():
        pool[name].send(
            {
                "cmd": "run",
                "rate": rate,
                "seconds": seconds,
                "seed": seeds[name],
                "start": start,
                "give_up": give_up[name],
            }
        )
    limit = seconds + max(drain.values()) + 120
    out = {name: pool[name].receive(limit) for name in rates}
    if hog is not None:
        out["_hog"] = hog.receive(limit)
    return out


@contextlib.contextmanager
def nodeagent_mps(
    replicas: int, thread_percentage: int | None, root: Path, simulate: str | None = None
) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """The MPS control daemon started and limited by nodeagent (its Python API, as
    `nodeagent mps start` does), quit on the way out. Yields the clients' environment.
    `simulate`: on the emulator with the tests' fake MPS daemon (dra_shares)."""
    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.settings import MpsSettings, validate
    from nodeagent.nvml import read_inventory

    binary = dra_shares.control_program(simulate, root)
    session = dra_shares.nvml_session(simulate, root)
    settings = MpsSettings(
        devices=(0,),
        replicas=replicas,
        thread_percentage=thread_percentage,
        pipe_dir=root / "pipe",
        log_dir=root / "log",
        ready_file=root / "ready",
        control_binary=binary,
    )
    for d in (settings.pipe_dir, settings.log_dir):
        d.mkdir(parents=True, exist_ok=True)
    try:
        daemon = MpsDaemon(settings, validate(settings, read_inventory(session)))
    except BaseException:
        dra_shares.release_session(session, simulate)
        raise
    try:
        status = daemon.start()  # inside: an interrupt while it starts still quits the daemon
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(settings.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(settings.log_dir),
        }
        yield (
            env,
            {
                "replicas": replicas,
                "thread_percentage": status.thread_percentage,
                "pinned_memory_bytes": {str(k): v for k, v in status.pinned_bytes.items()},
            },
        )
    finally:
        daemon.stop()
        dra_shares.release_session(session, simulate)


def gpu_info(device: str) -> dict[str, str]:
    if not device.startswith("cuda"):
        return {"gpu": f"none ({device}: fake models)", "driver": "-", "cuda": "-"}
    from nodeagent.nvml import load_real_library, open_session, read_inventory

    inventory = read_inventory(open_session(load_real_library()))
    gpu = inventory.gpus[0]
    v = inventory.cuda_driver_version
    return {
        "gpu": gpu.name,
        "memory_mib": str(gpu.memory_total_bytes >> 20),
        "driver": inventory.driver_version,
        "cuda": f"{v // 1000}.{v % 1000 // 10}",
    }


class Activity:
    """The GPU's activity while one model runs alone (GPM SM activity, NVML utilization):
    the solo GPU time the weighted MPS split is proportional to. Empty without a GPU."""

    def __init__(self, device: str) -> None:
        self.reader: Any = None
        self.session: Any = None
        if device.startswith("cuda"):
            from nodeagent.nvml import load_real_library, open_session
            from nodeagent.nvml.gpm import GpmReader

            self.session = open_session(load_real_library())
            reader = GpmReader(self.session)
            self.reader = reader if reader.supported(0) else None

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        out: dict[str, float] = {}
        first = self.reader.sample(0) if self.reader else None
        try:
            yield out
            if first is not None:
                second = self.reader.sample(0)
                out.update(self.reader.ratios(first, second))
                self.reader.free(second)
            if self.session is not None:  # also where GPM is not supported: the fallback
                from nodeagent.nvml.utilization import read_rates

                rates = read_rates(self.session, 0)
                utilization = None if rates is None else rates.gpu
                if utilization is not None:
                    out["utilization"] = utilization
        finally:
            if first is not None:
                self.reader.free(first)


class Study:
    """The phases, in order, with the results gathered into one JSON-able dict."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.specs: list[ModelSpec] = args.models
        self.names = [s.name for s in self.specs]
        self.results: dict[str, Any] = {"points": [], "isolation": [], "mps": {}, "workers": {}}
        self.capacity: dict[str, float] = {}
        self.slo: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self.activity = Activity(args.device)

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {text}", flush=True)

    def seeds(self, load_index: int) -> dict[str, int]:
        # The same arrivals for a model at a load in every mode: modes differ only in sharing.
        return {n: self.args.seed * 1000 + 10 * i + load_index for i, n in enumerate(self.names)}

    def drain(self) -> dict[str, float]:
        # >= the SLO: a request still queued then has already missed it (no bias).
        return {n: self.slo[n] + 0.25 for n in self.names}

    def record(
        self,
        mode: str,
        load: float,
        out: dict[str, dict[str, Any]],
        seconds: float,
        table: str = "points",
    ) -> None:
        for name in self.names:
            if name not in out:
                continue
            summary = slo.summarize(
                out[name]["arrivals"], out[name]["latencies"], self.slo[name], seconds
            )
            row = {
                "mode": mode,
                "load": load,
                "model": name,
                "rate_per_second": load * self.capacity[name],
                "seconds": seconds,
                **summary,
                "latencies_ms": [round(x * 1e3, 2) for x in out[name]["latencies"]],
            }
            if "_hog" in out:
                row["hog_iterations_per_second"] = (
                    out["_hog"]["iterations"] / out["_hog"]["seconds"]
                )
            self.results[table].append(row)
            tag = "isolation " if table == "isolation" else ""
            self.log(
                f"{tag}{mode:<13} load {load:.2f} {name:<6} n={summary['requests']:<5} "
                f"p50 {slo.fmt_ms(float(summary['p50']))} p99 {slo.fmt_ms(float(summary['p99']))} ms "
                f"within SLO {100 * float(summary['within_slo']):.1f} %"
            )

    def calibrate(self, pool: dict[str, Worker]) -> None:
        calibration = {}
        for name in self.names:
            with self.activity.measure() as activity:
                pool[name].send(
                    {"cmd": "calibrate", "seconds": self.args.calibrate_seconds, "min_requests": 30}
                )
                service = pool[name].receive(300)["service"]
            self.capacity[name] = 1 / slo.mean(service)
            self.slo[name] = slo.slo_seconds(service, self.args.slo_multiple)
            calibration[name] = {
                "requests": len(service),
                "service_mean": slo.mean(service),
                "service_p50": slo.percentile(service, 50),
                "service_p99": slo.percentile(service, 99),
                "capacity_per_second": self.capacity[name],
                "slo_seconds": self.slo[name],
                "activity": activity,
            }
            self.log(
                f"calibrate {name}: {len(service)} requests, mean {slo.fmt_ms(slo.mean(service))} ms,"
                f" p99 {slo.fmt_ms(slo.percentile(service, 99))} ms -> capacity"
                f" {self.capacity[name]:.1f}/s, SLO {slo.fmt_ms(self.slo[name])} ms, GPU {activity}"
            )
        self.results["calibration"] = calibration

    def sweep(self, mode: str, pool: dict[str, Worker], names: list[str], seconds: float) -> None:
        for i, load in enumerate(self.args.loads):
            rates = {n: load * self.capacity[n] for n in names}
            length = self.point_seconds(seconds, rates, i)
            out = run_point(pool, rates, length, self.seeds(i), self.drain())
            self.record(mode, load, out, length)

    def point_seconds(self, floor: float, rates: dict[str, float], load_index: int) -> float:
        """A point's length: `floor`, or with --min-requests until each model's seeded Poisson
        stream has had that many arrivals (the same stream its worker draws)."""
        n = self.args.min_requests
        if not n:
            return floor
        seeds = self.seeds(load_index)
        longest = floor
        for name, rate in rates.items():
            horizon = 3 * n / rate + 10
            arrivals = slo.poisson_arrivals(rate, horizon, seeds[name])
            longest = max(longest, arrivals[n - 1] + 1e-3 if len(arrivals) >= n else horizon)
        return longest

    def sweep_seconds(self, names: list[str], floor: float) -> float:
        """What one sweep of `names` together will take (points and ~1 s drain each)."""
        return sum(
            self.point_seconds(floor, {n: load * self.capacity[n] for n in names}, i) + 1
            for i, load in enumerate(self.args.loads)
        )

    def isolation(self, mode: str, pool: dict[str, Worker], hog: Worker) -> None:
        load = self.args.isolation_load
        rates = {n: load * self.capacity[n] for n in self.names}
        out = run_point(pool, rates, self.args.isolation_seconds, self.seeds(99), self.drain(), hog)
        self.record(mode, load, out, self.args.isolation_seconds, "isolation")

    def plain_phase(self) -> None:
        """Solo, time-slicing and the time-sliced isolation share one set of processes: an idle
        process holds a CUDA context but gets no time slices."""
        args = self.args
        specs = list(self.specs)
        if not args.no_isolation:
            specs.append(ModelSpec("_hog", "fake" if args.device == "cpu" else "hog"))
        with workers(specs, dict(os.environ), args) as (pool, ready):
            self.results["workers"].update(ready)
            self.log(
                "workers ready: "
                + ", ".join(f"{n} {r['build_seconds']:.1f} s" for n, r in ready.items())
            )
            self.calibrate(pool)
            if self.args.min_requests:
                solo = sum(self.sweep_seconds([n], self.args.solo_seconds) for n in self.names)
                together = self.sweep_seconds(self.names, self.args.point_seconds)
                self.log(
                    f"points of >= {self.args.min_requests} requests: solo {solo:.0f} s in all,"
                    f" {together:.0f} s a together mode"
                )
            for name in self.names:
                self.sweep("solo", pool, [name], args.solo_seconds)
            if "time-slicing" in args.modes:
                self.sweep("time-slicing", pool, self.names, args.point_seconds)
                if not args.no_isolation:
                    self.isolation("time-slicing", pool, pool["_hog"])

    def mps_phase(self, mode: str) -> None:
        args = self.args
        n = len(self.specs)
        per_model: dict[str, dict[str, str]] = {}
        daemon_percentage = None  # nodeagent's default: 100 // replicas
        if mode == "mps-weighted":
            weights = slo.weighted_percentages(
                {k: solo_gpu_share(v) for k, v in self.results["calibration"].items()}
            )
            # The daemon's default caps every client; each client's own variable lowers it.
            daemon_percentage = max(weights.values())
            per_model = {
                k: {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(v)} for k, v in weights.items()
            }
        specs = list(self.specs)
        isolate = mode == "mps-equal" and not args.no_isolation
        if isolate:
            specs.append(ModelSpec("_hog", "hog"))
        with nodeagent_mps(n, daemon_percentage, args.mps_dir) as (env, limits):
            limits["client_thread_percentage"] = {
                k: int(v["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) for k, v in per_model.items()
            } or {k: int(limits["thread_percentage"]) for k in self.names}
            self.results["mps"][mode] = limits
            self.log(f"{mode}: nodeagent MPS up, limits {limits}")
            with workers(specs, dict(os.environ, **env), args, per_model) as (pool, _):
                self.sweep(mode, pool, self.names, args.point_seconds)
                if isolate:
                    self.isolation(mode, pool, pool["_hog"])

    def dra_phase(self, mode: str) -> None:
        """The models as the clients of share claims (dra_shares.py): prepared by the driver
        (dra-shares; dra-per-claim with --per-claim-settings) or a daemon per claim as the
        driver ran them before issue 38 (dra-per-claim)."""
        args = self.args
        shares = dra_shares.shares_for(self.names, args.share_percent, args.share_memory)
        root = Path(tempfile.mkdtemp(prefix="voice-dra-", dir="/tmp"))  # unix sockets: short
        if mode == "dra-shares" or args.per_claim_settings:
            settings = args.settings if mode == "dra-shares" else args.per_claim_settings
            prepared = dra_shares.prepared_shares(shares, root, args.simulate, settings)
        else:
            prepared = dra_shares.per_claim_daemons(shares, root, args.simulate)
        try:
            with prepared as made:
                summary = made.summary()
                self.results["mps"][mode] = summary
                self.log(
                    f"{mode}: {len(made.clients)} share claims in {made.prepare_seconds:.1f} s,"
                    f" {made.daemons()} MPS daemon(s), limits "
                    + ", ".join(f"{c.model} {c.limits()}" for c in made.clients)
                )
                envs = dra_shares.environments(os.environ, made)
                with workers(self.specs, {}, args, envs) as (pool, _):
                    pids = {n: w.proc.pid for n, w in pool.items()}
                    if args.simulate:  # fake models: a fake CUDA client stands in for each
                        summary["clients"] = dra_shares.probe_clients(made, envs)
                    else:
                        summary["clients"] = dra_shares.servers_of(made, pids)
                    self.log(f"{mode}: clients {summary['clients']}")
                    self.sweep(mode, pool, self.names, args.point_seconds)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def solo_gpu_share(calibration: dict[str, Any]) -> float:
    """A model's solo GPU time per second of its traffic at a given load fraction: the share of
    the GPU's SMs it keeps active when it runs alone at capacity (GPM SM activity); NVML's
    utilization (time any kernel runs) where GPM is missing."""
    activity = calibration["activity"]
    share = activity.get("sm_active", activity.get("utilization"))
    if share is None:
        raise SystemExit("no GPU activity measured: the weighted MPS split needs GPM or NVML")
    return max(float(share), 0.01)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the report written; 1 (one sentence) when NVML or MPS fails; 2 bad options."""
    from nodeagent.base.errors import AgentError

    try:
        args = options(argv)
        if args.study:
            import study

            return study.run_study(args)
        return run_study(args)
    except AgentError as err:
        print(f"voice benchmark: {err}", file=sys.stderr)
        return 1


def run_study(args: argparse.Namespace) -> int:
    n, loads = len(args.models), len(args.loads)
    together = [m for m in args.modes if m != "solo"]
    isolation_modes = (
        0 if args.no_isolation else sum(m in together for m in ("time-slicing", "mps-equal"))
    )
    plan = slo.plan_seconds(
        models=n,
        loads=loads,
        solo_seconds=args.solo_seconds,
        together_modes=len(together),
        point_seconds=args.point_seconds,
        isolation_modes=isolation_modes,
        isolation_seconds=args.isolation_seconds,
        drain_seconds=1.0,
        calibrate_seconds=args.calibrate_seconds,
        startups=1 + sum(m != "time-slicing" for m in together),
        startup_seconds=25.0,
    )
    print(
        f"plan: {n} models x {loads} loads {list(args.loads)} solo at {args.solo_seconds:g} s"
        f" + {len(together)} together modes x {loads} loads at {args.point_seconds:g} s"
        f" + {isolation_modes} isolation points at {args.isolation_seconds:g} s; SLO ="
        f" {args.slo_multiple:g} x solo p99"
        + (
            f"; each point lasts until every model has had {args.min_requests} arrivals"
            " (lengths printed after calibration)"
            if args.min_requests
            else ""
        )
    )
    print(
        "plan (s, ~1 s drain a point, ~25 s a worker start): "
        + ", ".join(f"{k} {v:.0f}" for k, v in plan.items()),
        flush=True,
    )
    # SIGTERM (a timeout) unwinds like Ctrl-C, so the MPS daemon is quit in `finally`.
    signal.signal(signal.SIGTERM, interrupt)
    args.out.mkdir(parents=True, exist_ok=True)
    study = Study(args)
    study.results["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **gpu_info(args.device),
        "models": [s.__dict__ for s in args.models],
        "loads": list(args.loads),
        "modes": list(args.modes),
        "slo_multiple": args.slo_multiple,
        "solo_seconds": args.solo_seconds,
        "point_seconds": args.point_seconds,
        "isolation_seconds": args.isolation_seconds,
        "isolation_load": args.isolation_load,
        "calibrate_seconds": args.calibrate_seconds,
        "seed": args.seed,
        "quick": args.quick,
        "study": args.study,
        "min_requests": args.min_requests,
        "simulate": args.simulate,
        "share": {"sm_percent": args.share_percent, "memory": args.share_memory},
        "plan_seconds": plan,
    }
    meta = study.results["meta"]
    meta["skipped"], meta["interrupted"] = [], False
    try:
        study.plain_phase()
        for mode in together:
            if mode == "time-slicing":
                continue
            isolate = mode == "mps-equal" and not args.no_isolation
            needs = (
                25
                + study.sweep_seconds(study.names, args.point_seconds)
                + isolate * (args.isolation_seconds + 1)
            )
            elapsed = time.perf_counter() - study.t0
            if elapsed + needs > args.budget_seconds:
                study.log(
                    f"{mode}: skipped, {needs:.0f} s more would pass the {args.budget_seconds:g} s budget"
                )
                meta["skipped"].append(mode)
                continue
            if mode in DRA_MODES:
                study.dra_phase(mode)
            else:
                study.mps_phase(mode)
    except KeyboardInterrupt:
        if "calibration" not in study.results:
            raise
        study.log("interrupted: the report holds the points measured so far")
        meta["interrupted"] = True
    study.results["meta"]["wall_seconds"] = time.perf_counter() - study.t0
    derived = report.derive(study.results)
    study.results["derived"] = derived
    paths = report.write(study.results, args.out, args.name, png=not args.no_plot)
    print(report.markdown(study.results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    from nodeagent.base.logs import configure_logging

    configure_logging("warning")  # the driver's and the daemons' info lines would bury the points
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
