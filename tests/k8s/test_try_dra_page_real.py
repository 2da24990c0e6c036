"""docs/try-dra.md does what it says: its blocks marked `<!-- runnable-k8s: SPEC -->`, in order,
as one bash script, on the suite's control plane (the page's first block, up.sh, is what the
suite's fixture does): the Node, the DeviceClasses, the agent with --kube --dra on the emulator,
a claim allocated and its slice made before the pod binds, the fake kubelet's prepare and
unprepare, the agent stopped with exit 0."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.k8s import ControlPlane
from tests.support.pages import REPO, run_page

PAGE = REPO / "docs" / "try-dra.md"


def test_the_try_dra_page_runs(control_plane: ControlPlane, short_tmp: Path) -> None:
    cleanup = [["pod", "asr", "--force", "--grace-period=0"], ["resourceclaim", "asr-slice"]]
    proc = run_page(PAGE, control_plane, short_tmp, "dra", cleanup)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    out = proc.stdout
    assert "pod/asr condition met" in out
    assert re.search(r"gpu-0-mig-1g18gb-19-\d: gpu.nodeagent.io/SliceReady=True", out), out
    assert re.search(r"A  1g\.18gb", out) and "NVIDIA_VISIBLE_DEVICES=MIG-" in out, out
    assert out.rstrip().endswith("no slices"), out
    assert "Traceback" not in (short_tmp / "dra" / "agent.log").read_text()
