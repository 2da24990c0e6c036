"""The floor of any Python `status`: import pynvml, nvmlInit, read each GPU's name, memory and
MIG mode, nvmlShutdown; against `import pynvml` alone (the budget's yardstick). Run on a machine
with NVIDIA GPUs: python benchmarks/nvml_floor.py [--runs N]."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

FLOOR = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetMigMode(h)
pynvml.nvmlShutdown()
"""


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs + 2):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\\n\\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--python", default=sys.executable, help="interpreter and its flags")
    args = parser.parse_args()
    python = args.python.split()
    base = median_seconds([*python, "-c", "import pynvml"], args.runs)
    floor = median_seconds([*python, "-c", FLOOR], args.runs)
    status = median_seconds([*python, "-m", "nodeagent", "status"], args.runs)
    print(f"{'import pynvml':<44}{base * 1e3:>8.0f} ms  1.00x")
    print(
        f"{'import, init, 3 reads a GPU, shutdown':<44}{floor * 1e3:>8.0f} ms  {floor / base:.2f}x"
    )
    print(f"{'nodeagent status':<44}{status * 1e3:>8.0f} ms  {status / base:.2f}x")


if __name__ == "__main__":
    main()
