"""What one scrape reaches: the nodeagent modules (files) and packages whose code runs while
the agent's collectors collect once, and how long that collection takes.

An agent on an emulated node (h200x2, MPS managed on both GPUs) reads its GPUs and reconciles once
(with --dra: started with --kube --dra against the tests' loopback API server); then one `collect()` of its registry runs under sys.setprofile, recording every function of
nodeagent that was called, and the same collection is timed without the profiler.

Run (from the repository root): .venv/bin/python benchmarks/scrape_reach.py [--runs N] [--dra]
Prints the modules reached, their count and packages, and the median collection time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.base.errors import MpsError  # noqa: E402
from nodeagent.mps.control import MpsControl  # noqa: E402
from nodeagent.nvml import NvmlSession  # noqa: E402
from nodeagent.sim import SimulatedNvml, parse_spec  # noqa: E402
from tests.support.agent import make_agent  # noqa: E402  (after the path)
from tests.support.cluster import kube_group  # noqa: E402
from tests.support.dra import NODE, dra_cluster, dra_group  # noqa: E402
from tests.support.fake_mps.script import control_script  # noqa: E402
from tests.support.reach import modules_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="timed collections")
    parser.add_argument("--dra", action="store_true", help="an agent with --kube --dra")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FAKE_MPS_SERVER"] = "1"
        control = str(control_script(Path(tmp) / "daemon"))
        lib = SimulatedNvml(parse_spec("h200x2"))
        mps = {
            "enabled": True,
            "pipe_dir": Path(tmp) / "pipe",
            "log_dir": Path(tmp) / "log",
            "control": control,
        }
        cluster = dra_cluster() if args.dra else None
        kube: dict[str, Any] = {}
        if cluster is not None:
            cluster.add_node(NODE, {"kubernetes.io/hostname": NODE})
            kube = {"kube": kube_group(cluster, NODE), "dra": dra_group(Path(tmp))}
        agent = make_agent(NvmlSession(lib), lib.reset, mps=mps, **kube)
        if cluster is not None:
            agent.start()
            agent.publish_dra()
        else:
            agent.refresh()
            agent.reconcile()
        registry = agent.registry

        def collect() -> None:
            for _ in registry.collect():
                pass

        modules = modules_run(collect)
        packages = sorted({".".join(m.split(".")[:2]) for m in modules})
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            collect()
            times.append(time.perf_counter() - start)
        agent.stop()
        if cluster is not None:
            cluster.close()
        with contextlib.suppress(MpsError):  # a daemon the agent did not start
            MpsControl(control, Path(tmp) / "pipe", Path(tmp) / "log").command("quit")
    for module in sorted(modules):
        print(f"  {module}")
    print(f"modules reached: {len(modules)} in {len(packages)} packages: {', '.join(packages)}")
    print(
        f"collect(): median {statistics.median(times) * 1e3:.3f} ms,"
        f" p90 {statistics.quantiles(times, n=10)[-1] * 1e3:.3f} ms over {args.runs} runs"
    )


if __name__ == "__main__":
    main()
