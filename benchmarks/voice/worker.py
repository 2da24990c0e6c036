"""One model instance in its own process (like a Triton model instance): builds its model, then
answers the orchestrator's commands, one JSON object a line on stdin; replies are stdout lines
that start with `@@ ` (anything else a library prints is passed through as log).

Commands: calibrate (closed loop: service times with no queueing), run (open-loop Poisson
arrivals from a common wall-clock start), hog (an unbounded loop of requests until a deadline),
quit."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import models
import slo

PREFIX = "@@ "


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def wait_wall(start_wall: float) -> float:
    """Sleep until the common start (wall clock, shared by the processes); return the
    perf_counter value that stands for it."""
    delay = start_wall - time.time()
    if delay > 0:
        time.sleep(delay)
    return time.perf_counter()


def calibrate(request: models.Request, seconds: float, min_requests: int) -> dict[str, Any]:
    service: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(service) < min_requests:
        t0 = time.perf_counter()
        request()
        service.append(time.perf_counter() - t0)
        if len(service) >= 20 * min_requests and time.perf_counter() >= end:
            break
    return {"service": service}


def run(request: models.Request, command: dict[str, Any], spin: bool) -> dict[str, Any]:
    arrivals = slo.poisson_arrivals(command["rate"], command["seconds"], command["seed"])
    origin = wait_wall(command["start"])

    def now() -> float:
        return time.perf_counter() - origin

    def wait_until(t: float) -> None:
        if spin:
            # An idle worker polls, so a request finds its CPU awake: a vCPU that halted in
            # sleep() made requests 1.5x slower and far more variable than back to back.
            while now() < t:
                pass
            return
        delay = t - now()
        if delay > 0:
            time.sleep(delay)

    busy = 0.0

    def serve() -> None:  # the time this process spends serving: its demand where no GPU says
        nonlocal busy
        t0 = time.perf_counter()
        request()
        busy += time.perf_counter() - t0

    latencies = slo.serve_open_loop(arrivals, serve, now, wait_until, command["give_up"])
    return {"arrivals": arrivals, "latencies": latencies, "busy_seconds": busy}


def hog(request: models.Request, command: dict[str, Any]) -> dict[str, Any]:
    origin = wait_wall(command["start"])
    done = 0
    while time.perf_counter() - origin < command["seconds"]:
        request()
        done += 1
    return {"iterations": done, "seconds": time.perf_counter() - origin}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True, choices=sorted(models.BUILDERS))
    parser.add_argument("--overrides", default="{}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--idle", choices=("spin", "sleep"), default="spin")
    parser.add_argument("--cpus", default="", help="CPU ids to pin this process to (1,2)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    request, description = models.BUILDERS[args.kind](json.loads(args.overrides), args.device)
    if args.cpus:  # after the build: workers started together build on every CPU
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    for _ in range(3):
        request()
    warm_end = time.perf_counter() + args.warmup_seconds
    while time.perf_counter() < warm_end:
        request()
    ready: dict[str, Any] = {
        "ready": True,
        "cpus": sorted(os.sched_getaffinity(0)),
        "description": description,
        "build_seconds": time.perf_counter() - t0,
    }
    if args.device.startswith("cuda"):
        import torch
        import transformers

        ready["gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
        ready["torch"] = torch.__version__
        ready["transformers"] = transformers.__version__
    reply(ready)
    for line in sys.stdin:
        command = json.loads(line)
        name = command["cmd"]
        if name == "quit":
            break
        if name == "calibrate":
            reply(calibrate(request, command["seconds"], command["min_requests"]))
        elif name == "run":
            reply(run(request, command, args.idle == "spin"))
        elif name == "hog":
            reply(hog(request, command))
        else:
            reply({"error": f"unknown command {name!r}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
