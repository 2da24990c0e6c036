"""Three models, one GPU: the burst shares study (issue 45), `run.py --study`.

One call (one GPU command, under 10 minutes) measures, on one machine:

1. the models' solo capacity (closed loop) and each model's SLO: `--slo-multiple` x its p99
   alone at `--slo-load` (open loop, queueing counted), measured in this call;
2. rounds (`--rounds`, >= 3) of the modes interleaved: solo (each model alone), time-slicing,
   dra-capped (share claims whose MpsShare `smLimit` is the request: the limit before issue
   45), dra-burst (share claims with the driver's default limit, 100), dra-low (dra-burst with
   the embedder, the last model, at MpsShare `priority: low`) and mps (the device-plugin
   path's daemon, nodeagent's MpsDaemon, uncapped), each at every load of `--loads`;
3. each share claim's `sm` request sized from the model's demand at the load: its solo GPU
   busy fraction in round 1's solo point (GPM SM activity; NVML utilization, or the process's
   own busy time, where that is missing), rounded up to the share device's step.

Round 1's solo points come first, so the claims are sized from them; then every mode's
processes are started at once (the DRA modes' claims prepared by nodeagent's driver through
the fake kubelet, dra_shares.py, one driver and so one MPS server per mode and load) and kept
for the rest of the call: an idle process holds its context and gets no time slices, and
only one mode has arrivals at a time. The results go to `--out/--name.json` (.md, .png);
`report.py A.json B.json ...` merges calls (verdict.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import dra_shares
import run
import slo
import verdict

STUDY_MODES = run.STUDY_MODES  # each round's order (run.py parses the options)
DRA_MODES = ("dra-capped", "dra-burst", "dra-low")
SHARED_MODES = (*DRA_MODES, "mps")  # processes of their own, started after round 1's solo
# The plan's assumptions (seconds), from the H200 runs of results/: a pool's start (model
# build and warm-up, in parallel), every mode's pools started at once, a prepare, a point's
# drain and transfer, the end (daemons quit, claims unprepared).
PLAIN_START_SECONDS = 25.0
SHARED_START_SECONDS = 45.0
PREPARE_SECONDS = 5.0
DRAIN_SECONDS = 1.5
TEARDOWN_SECONDS = 15.0
FIT_SECONDS = 570.0  # a GPU command's 600 s, less the machine's own start of the command


def share_config(mode: str, model: str, low: str, request: int, user: int) -> dict[str, Any]:
    """A DRA mode's MpsShare parameters for one model's claim: its user (the harness's uid,
    the uid its MPS server must run as); dra-capped also `smLimit` = the request (a ceiling
    at the request, the behaviour before issue 45); dra-low also `priority: low` for the
    model `low` (the embedder); dra-burst nothing more (the driver's default limit)."""
    config: dict[str, Any] = {"user": user}
    if mode == "dra-capped":
        config["smLimit"] = request
    elif mode == "dra-low" and model == low:
        config["priority"] = "low"
    return config


def points_per_round(modes: tuple[str, ...], models: int, loads: int) -> int:
    """Points in one round: solo is one point per model, every other mode one per load."""
    return loads * sum(models if m == "solo" else 1 for m in modes)


def plan_seconds(args: argparse.Namespace) -> dict[str, float]:
    """What one call will take, phase by phase (the --dry-run print)."""
    n, loads = len(args.models), len(args.loads)
    shared = [m for m in args.modes if m in SHARED_MODES]
    prepares = loads * sum(m in DRA_MODES for m in args.modes)
    point = args.point_seconds + DRAIN_SECONDS
    phases = {
        "start": PLAIN_START_SECONDS,
        "calibrate": n * (args.calibrate_seconds + 1),
        "slo": n * (args.slo_seconds + DRAIN_SECONDS),
        "start modes": (SHARED_START_SECONDS + PREPARE_SECONDS * prepares) if shared else 0.0,
        "rounds": args.rounds * points_per_round(args.modes, n, loads) * point,
        "end": TEARDOWN_SECONDS,
    }
    phases["total"] = sum(phases.values())
    return phases


def plan_text(args: argparse.Namespace) -> str:
    plan = plan_seconds(args)
    n = len(args.models)
    return (
        f"plan: {n} models, loads {list(args.loads)}, {args.rounds} rounds of"
        f" {','.join(args.modes)} ({points_per_round(args.modes, n, len(args.loads))} points"
        f" of {args.point_seconds:g} s a round); SLO = {args.slo_multiple:g} x solo p99 at load"
        f" {args.slo_load:g} ({args.slo_seconds:g} s a model)\n"
        "plan (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in plan.items())
        + f" = {plan['total'] / 60:.1f} min (budget {args.budget_seconds:g} s; a GPU command"
        " may run 600 s)"
        + (
            "\nplan: too long for one GPU command: split --loads over calls, or fewer --rounds"
            " or shorter --point-seconds"
            if plan["total"] > FIT_SECONDS
            else ""
        )
    )


def demand_of(row: dict[str, Any]) -> tuple[float, str]:
    """A solo point's GPU busy fraction and where it came from: GPM SM activity, else NVML
    utilization, else the share of the point its process spent serving."""
    activity = row.get("activity") or {}
    for key in ("sm_active", "utilization"):
        if activity.get(key) is not None:
            return float(activity[key]), key
    return float(row["busy_fraction"]), "process"


class BurstStudy(run.Study):
    """The call's phases, in order; the results in one JSON-able dict."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.results.update(slo_points=[], shares={}, refused={}, mps={})
        self.cpus = run.cpu_sets(len(self.specs))  # a model's CPUs: the same in every mode
        self.pools: dict[tuple[str, float | None], dict[str, run.Worker]] = {}
        self.low = self.names[-1]  # the embedder in the default trio
        self.start_seconds = 0.0
        self.modes_started = False

    def round_seeds(self, round_index: int, load: float) -> dict[str, int]:
        # One stream per model, load and round, the same in every mode of the round.
        base = self.args.seed * 100_000 + round_index * 1000 + round(load * 100)
        return {n: base + 7919 * i for i, n in enumerate(self.names)}

    def point(
        self,
        mode: str,
        load: float,
        pool: dict[str, run.Worker],
        names: list[str],
        seeds: dict[str, int],
        seconds: float,
        table: str = "points",
    ) -> list[dict[str, Any]]:
        rates = {n: load * self.capacity[n] for n in names}
        with self.activity.measure() as activity:
            out = run.run_point(pool, rates, seconds, seeds, self.drain())
        before = len(self.results[table])
        self.record(mode, load, out, seconds, table)
        rows: list[dict[str, Any]] = self.results[table][before:]
        for row in rows:
            row["busy_fraction"] = out[row["model"]]["busy_seconds"] / seconds
            if len(names) == 1:  # the GPU's activity is this model's alone
                row["activity"] = activity
        return rows

    def slo_phase(self, pool: dict[str, run.Worker]) -> None:
        """Each model alone at --slo-load: its SLO is --slo-multiple x that p99."""
        load = self.args.slo_load
        for name in self.names:
            seeds = {name: self.args.seed * 100_000 + 99_000 + self.names.index(name)}
            (row,) = self.point(
                "slo", load, pool, [name], seeds, self.args.slo_seconds, "slo_points"
            )
            p99 = float(row["p99"])
            if not math.isfinite(p99) or row["requests"] == 0:
                raise SystemExit(
                    f"voice benchmark: {name} alone at load {load:g} served"
                    f" {row['requests'] - row['missed']} of {row['requests']} requests: no p99"
                    " to take its SLO from (a longer --slo-seconds or a lower --slo-load)"
                )
            self.slo[name] = self.args.slo_multiple * p99
            row["slo_seconds"] = self.slo[name]
            row["within_slo"] = slo.attainment(
                [x / 1e3 for x in row["latencies_ms"]], self.slo[name]
            )
            self.results["calibration"][name]["slo_seconds"] = self.slo[name]
            self.results["calibration"][name]["solo_p99_at_slo_load"] = p99
            self.log(f"SLO {name}: {self.args.slo_multiple:g} x {slo.fmt_ms(p99)} ms ="
                     f" {slo.fmt_ms(self.slo[name])} ms")  # fmt: skip

    def size_shares(self, load: float) -> dict[str, int]:
        """The `sm` requests at `load` from round 1's solo points (recorded in results)."""
        from nodeagent.dra.capacity import SM_STEP_PERCENT

        solo = {
            p["model"]: p
            for p in self.results["points"]
            if p["mode"] == "solo" and p["load"] == load and p["round"] == 1
        }
        demand = {n: demand_of(solo[n]) for n in self.names}
        requests, trimmed = slo.share_requests(
            {n: d for n, (d, _) in demand.items()}, SM_STEP_PERCENT
        )
        self.results["shares"][str(load)] = {
            "demand": {n: d for n, (d, _) in demand.items()},
            "source": {n: s for n, (_, s) in demand.items()},
            "sm_request_percent": requests,
            "trimmed": trimmed,
            "step_percent": SM_STEP_PERCENT,
        }
        self.log(f"load {load:g}: demand " + ", ".join(
            f"{n} {100 * d:.1f} % ({s})" for n, (d, s) in demand.items()
        ) + f" -> sm requests {requests}" + (" (trimmed to fit 100)" if trimmed else ""))  # fmt: skip
        return requests

    def start_modes(self, stack: contextlib.ExitStack) -> None:
        """Every shared mode's processes, started together: per load the DRA modes' claims
        (sized at that load) prepared by the driver, and the device-plugin path's daemon."""
        args = self.args
        started: dict[tuple[str, float | None], tuple[dict[str, run.Worker], Any]] = {}
        asked: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
        for load in args.loads:
            dra = [m for m in args.modes if m in DRA_MODES]
            requests = self.size_shares(load) if dra else {}
            for mode in dra:
                shares = [
                    dra_shares.Share(
                        n, requests[n], args.share_memory,
                        share_config(mode, n, self.low, requests[n], os.getuid()),
                    )
                    for n in self.names
                ]  # fmt: skip
                root = Path(tempfile.mkdtemp(prefix="voice-dra-", dir="/tmp"))  # short: sockets
                stack.callback(shutil.rmtree, root, ignore_errors=True)
                try:
                    made = stack.enter_context(
                        dra_shares.prepared_shares(shares, root, args.simulate, args.settings)
                    )
                except SystemExit as err:  # one mode refused: the others still run
                    self.results["refused"][f"{mode}@{load:g}"] = str(err).removeprefix(
                        "voice benchmark: "
                    )
                    self.log(f"{mode} at load {load:g}: refused: {err}")
                    continue
                envs = dra_shares.environments(os.environ, made)
                pool = run.start_pool(self.specs, {}, args, envs, self.cpus)
                stack.callback(run.close_pool, pool)
                started[(mode, load)] = (pool, made)
                asked[(mode, load)] = [
                    {"model": x.model, "sm_request_percent": x.sm_percent, "memory": x.memory,
                     "config": x.parameters()}
                    for x in shares
                ]  # fmt: skip
        if "mps" in args.modes:
            args.mps_dir.mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="mps-", dir=args.mps_dir))
            stack.callback(shutil.rmtree, root, ignore_errors=True)
            env, limits = stack.enter_context(
                run.nodeagent_mps(len(self.names), 100, root, args.simulate)
            )
            pool = run.start_pool(self.specs, dict(os.environ, **env), args, None, self.cpus)
            stack.callback(run.close_pool, pool)
            started[("mps", None)] = (pool, None)
            self.results["mps"]["mps"] = dict(
                limits, client_thread_percentage={n: "100" for n in self.names}
            )
        for key, (pool, made) in started.items():
            run.await_pool(pool)
            self.pools[key] = pool
            if made is None:
                continue
            summary = dict(made.summary(), shares=asked[key])
            envs = dra_shares.environments(os.environ, made)
            pids = {n: w.proc.pid for n, w in pool.items()}
            summary["clients"] = (
                dra_shares.probe_clients(made, envs)
                if args.simulate
                else dra_shares.servers_of(made, pids)
            )
            self.results["mps"][f"{key[0]}@{key[1]:g}"] = summary
            self.log(f"{key[0]} at load {key[1]:g}: {len(made.clients)} claims in"
                     f" {made.prepare_seconds:.1f} s, env " + ", ".join(
                         f"{c.model} {c.limits()}" for c in made.clients))  # fmt: skip
        self.log("every mode's processes ready: " + ", ".join(f"{k[0]}" for k in self.pools))

    def run_round(self, round_index: int, plain: dict[str, run.Worker], stack: Any) -> None:
        args = self.args
        for mode in args.modes:
            if mode in SHARED_MODES and not self.modes_started:
                self.modes_started = True
                began = time.perf_counter()
                self.start_modes(stack)
                self.start_seconds = time.perf_counter() - began
                self.results["meta"]["start_modes_seconds"] = self.start_seconds
            for load in args.loads:
                seeds = self.round_seeds(round_index, load)
                if mode == "solo":
                    rows = [
                        row
                        for n in self.names
                        for row in self.point(mode, load, plain, [n], seeds, args.point_seconds)
                    ]
                else:
                    pool = (
                        plain
                        if mode == "time-slicing"
                        else self.pools.get((mode, load)) or self.pools.get((mode, None))
                    )
                    if pool is None:  # refused at prepare: said once, in results["refused"]
                        continue
                    rows = self.point(mode, load, pool, self.names, seeds, args.point_seconds)
                for row in rows:
                    row["round"] = round_index

    def run(self) -> None:
        args = self.args
        with contextlib.ExitStack() as stack:
            plain = run.start_pool(self.specs, dict(os.environ), args, None, self.cpus)
            stack.callback(run.close_pool, plain)
            self.results["workers"].update(run.await_pool(plain))
            self.calibrate(plain)
            self.slo_phase(plain)
            meta = self.results["meta"]
            last = 0.0
            for r in range(1, args.rounds + 1):
                elapsed = time.perf_counter() - self.t0
                if r > 1 and elapsed + last > args.budget_seconds:
                    self.log(f"round {r}: skipped, {last:.0f} s more would pass the"
                             f" {args.budget_seconds:g} s budget")  # fmt: skip
                    break
                began, self.start_seconds = time.perf_counter(), 0.0
                self.run_round(r, plain, stack)
                meta["rounds_done"] = r
                last = time.perf_counter() - began - self.start_seconds  # a round's points
                # each round's points on disk at once: a call killed at its time limit keeps them
                verdict.write(self.results, args.out, args.name, png=False)
            self.log("done: quitting the daemons, unpreparing the claims")


def run_study(args: argparse.Namespace) -> int:
    """`run.py --study`: print the plan; with --dry-run stop there; else measure, write the
    results and print the report."""
    print(plan_text(args), flush=True)
    if args.dry_run:
        return 0
    signal.signal(signal.SIGTERM, run.interrupt)  # a timeout unwinds: daemons quit, claims go
    args.out.mkdir(parents=True, exist_ok=True)
    study = BurstStudy(args)
    study.results["meta"] = {
        "study": verdict.STUDY,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **run.gpu_info(args.device),
        "models": [s.__dict__ for s in args.models],
        "loads": list(args.loads),
        "modes": list(args.modes),
        "rounds": args.rounds,
        "rounds_done": 0,
        "slo_multiple": args.slo_multiple,
        "slo_load": args.slo_load,
        "slo_seconds": args.slo_seconds,
        "point_seconds": args.point_seconds,
        "calibrate_seconds": args.calibrate_seconds,
        "seed": args.seed,
        "simulate": args.simulate,
        "share_memory": args.share_memory,
        "low_priority_model": study.low,
        "plan_seconds": plan_seconds(args),
        "interrupted": False,
    }
    try:
        study.run()
    except KeyboardInterrupt:
        if not study.results["points"]:
            raise
        study.log("interrupted: the report holds the points measured so far")
        study.results["meta"]["interrupted"] = True
    study.results["meta"]["wall_seconds"] = time.perf_counter() - study.t0
    study.results.pop("isolation", None)
    paths = verdict.write(study.results, args.out, args.name, png=not args.no_plot)
    print(verdict.markdown(verdict.with_derived(study.results)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
