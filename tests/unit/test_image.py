"""The Dockerfile passes hadolint (from the test extras). `make image` builds and runs the image
itself; that needs root and buildah, so it is a make target, not a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )


def test_the_dockerfile_is_hadolint_clean() -> None:
    result = hadolint(ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above can fail: an unpinned base and a root user are findings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nUSER root\nCMD python3\n")
    result = hadolint(bad)
    assert result.returncode == 1
    for code in ("DL3007", "DL3002", "DL3025"):  # :latest, last USER root, CMD not JSON
        assert code in result.stdout, result.stdout


def test_nodeagent_never_imports_what_the_image_leaves_out() -> None:
    """image/slim.py removes the Kubernetes client's typed API classes and its asyncio half:
    importing every module of nodeagent (as the image's build does) loads neither."""
    code = (
        "import importlib, pkgutil, sys, nodeagent\n"
        "for m in pkgutil.walk_packages(nodeagent.__path__, 'nodeagent.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "from nodeagent.kube.transport import ApiException, Configuration\n"
        "left_out = ('kubernetes.client.api', 'kubernetes.client.apis', 'kubernetes.aio')\n"
        "print(sorted(n for n in sys.modules if n in left_out or n.startswith("
        "tuple(f'{p}.' for p in left_out))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[]\n"
