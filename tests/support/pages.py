"""A docs page's runnable blocks (a ```sh block after `<!-- runnable-k8s: SPEC -->`), in order,
as one bash script, run on a real control plane as a reader runs them from a checkout: in a
scratch folder that stands for the checkout (its `tests` and `nodeagent` linked), its `/tmp/`
paths moved into that folder and its Node `node-1` renamed, so that pages and tests share one
control plane. The page's agent is stopped whatever happens, and `cleanup` deleted."""

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
BLOCK = re.compile(r"<!-- runnable-k8s: ([a-z0-9x,-]+) -->\n```sh\n(.*?)```", re.S)


def page_script(page: Path, at_least: int) -> tuple[str, str]:
    """(the emulator spec, the script) of `page`'s runnable blocks."""
    blocks = BLOCK.findall(page.read_text())
    assert len(blocks) >= at_least, f"{page.name} lost its runnable blocks"
    (spec,) = {s for s, _ in blocks}
    return spec, "".join(text for _, text in blocks)


def run_page(
    page: Path,
    control_plane: ControlPlane,
    short_tmp: Path,
    folder: str,
    cleanup: list[list[str]],
    at_least: int = 5,
) -> subprocess.CompletedProcess[str]:
    """Run the page in `short_tmp` (`/tmp/<folder>/agent.pid` is its agent's pid file); then
    stop the agent and `kubectl delete --ignore-not-found` each of `cleanup` and the Node."""
    spec, script = page_script(page, at_least)
    node = f"try-{uuid.uuid4().hex[:8]}"  # a Node of its own on the shared control plane
    script = script.replace("/tmp/", f"{short_tmp}/").replace("node-1", node)
    for name in ("tests", "nodeagent"):  # the scratch folder stands for the checkout
        (short_tmp / name).symlink_to(REPO / name)
    bash, kubectl = shutil.which("bash"), shutil.which("kubectl")
    assert bash is not None and kubectl is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(KUBECONFIG=str(control_plane.kubeconfig), NODEAGENT_SIMULATE=spec,
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")  # fmt: skip
    pid = short_tmp / folder / "agent.pid"
    try:
        return subprocess.run(
            [bash, "-euo", "pipefail", "-c", script + f'wait "$(cat {folder}/agent.pid)"\n'],
            cwd=short_tmp, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)
        for what in [*cleanup, ["node", node]]:
            subprocess.run([kubectl, "delete", "--ignore-not-found", *what], env=env,
                           capture_output=True, timeout=60)  # fmt: skip
