"""The route of one DRA claim from the driver to NVML: which frames lie between
`NodeDriver.prepare` (what NodePrepareResources calls) and the emulator's
`nvmlDeviceCreateGpuInstanceWithPlacement`, and how often the change engine calls back into
nodeagent/dra/ on the way (a call into a nodeagent/dra/ function whose nearest nodeagent caller
lies outside nodeagent/dra/: the `wants` and `record` callbacks of before issue 43, a listener
of the ownership record), before and after the first NVML write; how often the route changes
package before that write, and how often the ownership record (owners.json) and the GPUs
(through NVML) are read per prepare.

One claim of a new 1g.18gb slice on GPU 0 of an emulated H200 (MIG already on, no latency
model), prepared by the agent's node side on a pipeline of its own (nodeagent.agent.factory
`dra_driver`, as benchmarks/dra.py builds it), traced with sys.setprofile in the calling thread.

Run: python benchmarks/trace_claim.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodeagent.agent.factory import dra_driver  # noqa: E402
from nodeagent.dra.claims import ClaimRef  # noqa: E402
from nodeagent.dra.node import NodeConfig  # noqa: E402
from nodeagent.nvml import MigWriter, NvmlSession  # noqa: E402
from nodeagent.settings import Settings  # noqa: E402

DRIVER = "gpu.nodeagent.io"
NODE = "trace"
DEVICE = "gpu-0-mig-1g18gb-19-6"
WRITE = "nvmlDeviceCreateGpuInstanceWithPlacement"
PACKAGE = REPO / "nodeagent"
DRA = PACKAGE / "dra"
SIM = PACKAGE / "sim"  # the emulator stands for the GPUs: not a package of the route
OWNERS = PACKAGE / "state" / "owners.py"
READ = PACKAGE / "nvml" / "read.py"
GPU_READ = "read_inventory"  # one read of the GPUs through NVML
RECORD_READ = (
    "_file"  # one read of the record (owners.json parsed, or kept while it is the same file)
)


def _where(frame: FrameType) -> Path:
    return Path(frame.f_code.co_filename).resolve()


def _ours(frame: FrameType) -> bool:
    return _where(frame).is_relative_to(PACKAGE)


def _caller(frame: FrameType) -> FrameType | None:
    """The nearest nodeagent frame that called `frame`, through the standard library
    (contextlib, functools) and the other libraries."""
    caller = frame.f_back
    while caller is not None and not _ours(caller):
        caller = caller.f_back
    return caller


def _in_emulator(frame: FrameType) -> bool:
    """The emulator's code, or what it calls (its file lock's helpers): it stands for the
    GPUs, not a step of the route."""
    at: FrameType | None = frame
    while at is not None:
        if _where(at).is_relative_to(SIM):
            return True
        at = at.f_back
    return False


def _name(frame: FrameType) -> str:
    path = _where(frame)
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown}:{frame.f_lineno} {frame.f_code.co_qualname}"


class Tracer:
    """Records the stack at the first NVML create call and every call back into dra/."""

    def __init__(self) -> None:
        self.route: list[FrameType] = []  # prepare first, the create call last
        self.reentries: list[tuple[str, str, bool]] = []  # (caller, callee, after the write)
        self.inside = 0  # every call of a nodeagent/dra/ function run inside the engine
        self.package: str | None = None  # the package of the last nodeagent call
        # The same count with base/'s helpers (logs, files, JSON, locks) folded into their
        # callers: the changes between the floors that hold the claim's rules.
        self.floor: str | None = None
        self.floor_changes = 0
        # calls into another nodeagent package than the last nodeagent call's (the emulator,
        # and the helpers it calls, not counted: it stands for the GPUs)
        self.package_changes = 0
        self.record_reads = [0, 0]  # owners.json read (and its checksum checked): before, after
        self.gpu_reads = [0, 0]  # the GPUs read through NVML: before the write, after
        self.driver_gpu_reads = 0  # of those, read by nodeagent/dra/ itself (not the engine)

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code.co_name == WRITE and not self.route:
            self.route = self._stack(frame)
            return
        if _ours(frame) and not _in_emulator(frame):
            package = _where(frame).relative_to(PACKAGE).parts[0]
            if not self.route and self.package is not None and package != self.package:
                self.package_changes += 1
            self.package = package
            if package != "base":
                if not self.route and self.floor is not None and package != self.floor:
                    self.floor_changes += 1
                self.floor = package
            if _where(frame) == OWNERS and frame.f_code.co_name == RECORD_READ:
                self.record_reads[bool(self.route)] += 1
            if _where(frame) == READ and frame.f_code.co_name == GPU_READ:
                self.gpu_reads[bool(self.route)] += 1
                caller = _caller(frame)
                self.driver_gpu_reads += caller is not None and _where(caller).is_relative_to(DRA)
        if not _where(frame).is_relative_to(DRA):
            return
        if self._under_engine(frame):
            self.inside += 1
        caller = _caller(frame)
        if caller is None or _where(caller).is_relative_to(DRA):
            return
        if frame.f_code.co_name == "prepare" and caller.f_code.co_filename == __file__:
            return
        self.reentries.append((_name(caller), _name(frame), bool(self.route)))

    @staticmethod
    def _under_engine(frame: FrameType) -> bool:
        """Whether a nodeagent frame outside dra/ lies between `frame` and the prepare."""
        at = frame.f_back
        while at is not None and not (
            at.f_code.co_name == "prepare" and _where(at) == _where(frame)
        ):
            if _ours(at) and not _where(at).is_relative_to(DRA):
                return True
            at = at.f_back
        return False

    @staticmethod
    def _stack(frame: FrameType) -> list[FrameType]:
        out: list[FrameType] = []
        at: FrameType | None = frame
        while at is not None:
            out.append(at)
            if at.f_code.co_name == "prepare" and _where(at).is_relative_to(DRA):
                break
            at = at.f_back
        return out[::-1]


def claim(uid: str) -> dict[str, Any]:
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": DEVICE}]
    return {
        "metadata": {"name": uid, "namespace": "trace", "uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": []}}},
    }


def trace(root: Path) -> dict[str, Any]:
    from nodeagent.sim import SimulatedNvml
    from nodeagent.sim.models import parse_spec

    lib = SimulatedNvml(parse_spec("h200"), root / "sim.json")
    session = NvmlSession(lib)
    MigWriter(session).set_mig_mode(0, True)
    config = NodeConfig(DRIVER, NODE, root / "p", root / "cdi")
    node = dra_driver(session, Settings(), config, lambda _i: None, root / ".mig.lock")
    tracer = Tracer()
    try:
        sys.setprofile(tracer)
        try:
            node.prepare(ClaimRef("trace", "claim-0", "uid-0"), claim("uid-0"))
        finally:
            sys.setprofile(None)
    finally:
        session.close()
    if not tracer.route:
        raise SystemExit(f"the claim's prepare never called {WRITE}")
    route = [_name(f) for f in tracer.route]
    files = {_where(f) for f in tracer.route if _ours(f)}
    ours = [f for f in tracer.route if _ours(f)]
    return {
        "route": route,
        "frames": len(route),
        "nodeagent_frames": len(ours),
        "nodeagent_files": len(files),
        "reentries": len(tracer.reentries),
        "reentries_before_write": sum(1 for *_, after in tracer.reentries if not after),
        "reentries_after_write": sum(1 for *_, after in tracer.reentries if after),
        "dra_calls_inside_the_engine": tracer.inside,
        "package_changes_before_write": tracer.package_changes,
        "package_changes_above_base_before_write": tracer.floor_changes,
        "record_reads_before_write": tracer.record_reads[0],
        "record_reads": sum(tracer.record_reads),
        "gpu_reads_before_write": tracer.gpu_reads[0],
        "gpu_reads": sum(tracer.gpu_reads),
        "gpu_reads_by_the_driver": tracer.driver_gpu_reads,
        "callbacks": Counter(f"{a} -> {b}" for a, b, _ in tracer.reentries).most_common(),
    }


def show(result: dict[str, Any]) -> None:
    print(f"frames from NodeDriver.prepare to {WRITE}:")
    for i, frame in enumerate(result["route"]):
        print(f"  {i:2d} {frame}")
    print(
        f"{result['frames']} frames ({result['nodeagent_frames']} in nodeagent/, in"
        f" {result['nodeagent_files']} files)"
    )
    print(
        f"calls back into nodeagent/dra/: {result['reentries']}"
        f" ({result['reentries_before_write']} before the first NVML write,"
        f" {result['reentries_after_write']} after)"
    )
    print(
        f"calls of nodeagent/dra/ functions made inside the engine (the callbacks and what they"
        f" call): {result['dra_calls_inside_the_engine']}"
    )
    print(
        f"package changes before the first NVML write: {result['package_changes_before_write']}"
        f" (a nodeagent call in another package than the nodeagent call before it, the emulator"
        " not counted)"
    )
    print(
        f"  of which between packages other than base/ (its helpers folded into their callers):"
        f" {result['package_changes_above_base_before_write']}"
    )
    print(
        f"record reads (owners.json consulted) per prepare: {result['record_reads']}"
        f" ({result['record_reads_before_write']} before the first NVML write)"
    )
    print(
        f"reads of the GPUs (nvml.read_inventory) per prepare: {result['gpu_reads']}"
        f" ({result['gpu_reads_before_write']} before the first NVML write;"
        f" {result['gpu_reads_by_the_driver']} by nodeagent/dra/ itself)"
    )
    for what, n in result["callbacks"]:
        print(f"  {n:3d} x {what}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trace-claim-", dir="/tmp"))
    try:
        result = trace(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    show(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
