"""docs/try-dra.md does what it says: its blocks marked `<!-- runnable-k8s: SPEC -->`, in order,
as one bash script, on the suite's control plane (the page's first block, up.sh, is what the
suite's fixture does): the Node, the DeviceClasses, the agent with --kube --dra on the emulator,
a claim allocated and its slice made before the pod binds, the fake kubelet's prepare and
unprepare, the agent stopped with exit 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.k8s import ControlPlane

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "try-dra.md"
BLOCK = re.compile(r"<!-- runnable-k8s: ([a-z0-9x,-]+) -->\n```sh\n(.*?)```", re.S)


def _script() -> tuple[str, str]:
    blocks = BLOCK.findall(PAGE.read_text())
    assert len(blocks) >= 5, "docs/try-dra.md lost its runnable blocks"
    (spec,) = {s for s, _ in blocks}
    return spec, "".join(text for _, text in blocks)


def test_the_try_dra_page_runs(control_plane: ControlPlane, short_tmp: Path) -> None:
    spec, script = _script()
    node = f"try-{uuid.uuid4().hex[:8]}"  # a Node of its own on the shared control plane
    script = script.replace("/tmp/", f"{short_tmp}/").replace("node-1", node)
    for name in ("tests", "nodeagent"):  # the scratch folder stands for the checkout
        (short_tmp / name).symlink_to(REPO / name)
    bash, kubectl = shutil.which("bash"), shutil.which("kubectl")
    assert bash is not None and kubectl is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(KUBECONFIG=str(control_plane.kubeconfig), NODEAGENT_SIMULATE=spec,
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")  # fmt: skip
    try:
        proc = subprocess.run(
            [bash, "-euo", "pipefail", "-c", script + 'wait "$(cat dra/agent.pid)"\n'],
            cwd=short_tmp, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        pid = short_tmp / "dra" / "agent.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)
        for what in (["pod", "asr", "--force", "--grace-period=0"], ["resourceclaim", "asr-slice"],
                     ["node", node]):  # fmt: skip
            subprocess.run([kubectl, "delete", "--ignore-not-found", *what], env=env,
                           capture_output=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    out = proc.stdout
    assert "pod/asr condition met" in out
    assert re.search(r"gpu-0-mig-1g18gb-19-\d: gpu.nodeagent.io/SliceReady=True", out), out
    assert re.search(r"A  1g\.18gb", out) and "NVIDIA_VISIBLE_DEVICES=MIG-" in out, out
    assert out.rstrip().endswith("no slices"), out
    assert "Traceback" not in (short_tmp / "dra" / "agent.log").read_text()
