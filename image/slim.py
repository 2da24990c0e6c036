"""Trim the image's venv to what nodeagent loads, then compile bytecode for exactly that.

Run by the Dockerfile's build stage with the venv's own python (so `importlib.metadata` sees the
venv's distributions), after `pip install --no-compile nodeagent`:

1. The Kubernetes client ships an asyncio twin of itself (`kubernetes.aio`, about 40 MB of
   source) and requires aiohttp and aiohttp-retry for it alone; nodeagent uses the synchronous
   client. The package directory goes, and so does every distribution that is required only
   through those two requirements of kubernetes (the walk below keeps anything another
   requirement still reaches).
2. Test suites that libraries ship inside their packages (never imported by the library).
3. Every module of nodeagent is imported, and bytecode is written for it and for everything it
   imports at import time (about 450 modules, 7 MB), not for the thousands of Kubernetes API and
   model modules it never loads. A module that fails to import fails the build: nothing trimmed
   was needed. Left out on purpose: `kubernetes.client.CoreV1Api` and `CustomObjectsApi`,
   loaded on first use, with the 250 models they import: their bytecode would add 5.6 MB to the
   image and save 1.2 s of CPU once per start of `run --kube` (measured in the image), and the
   image stays within its 80 MB budget without it.

Exits 1 with one line per module that does not import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import pkgutil
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = "nodeagent"
# (distribution, requirement) edges nodeagent never needs: kubernetes' asyncio client's.
UNUSED_REQUIREMENTS = {("kubernetes", "aiohttp"), ("kubernetes", "aiohttp-retry")}
UNUSED_PATHS = [
    "kubernetes/aio",
    "kubernetes/**/*_test.py",
    "kubernetes/dynamic/test_*.py",
    "websocket/tests",
]
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(dist: metadata.Distribution) -> set[str]:
    """Names a distribution requires, markers aside (kept: a trim must never under-keep);
    requirements of extras are left out (nodeagent installs none)."""
    names = set()
    for line in dist.requires or []:
        marker = line.partition(";")[2]
        match = NAME.match(line)
        if match and "extra" not in marker:
            names.add(canonical(match.group(1)))
    return names


def needed(dists: dict[str, metadata.Distribution]) -> set[str]:
    """Every installed distribution reachable from nodeagent, minus the unused edges."""
    seen, todo = set(), [ROOT]
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        todo += [r for r in requirements(dists[name]) if (name, r) not in UNUSED_REQUIREMENTS]
    return seen


def remove_unused(site: Path) -> None:
    """Delete UNUSED_PATHS (globs under site-packages), saying how much went."""
    for pattern in UNUSED_PATHS:
        paths = sorted(site.glob(pattern))
        files = [f for p in paths for f in ([*p.rglob("*")] if p.is_dir() else [p])]
        size = sum(f.stat().st_size for f in files if f.is_file())
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if paths:
            print(f"slim: removed {pattern} ({len(paths)} paths, {size / 1e6:.1f} MB)")


def import_all() -> list[str]:
    """Import every nodeagent module (not __main__, which would run the CLI); returns the
    failures."""
    failed = []
    package = importlib.import_module(ROOT)
    names = [m.name for m in pkgutil.walk_packages(package.__path__, f"{ROOT}.")]
    for name in names:
        if name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(name)
        except Exception as err:
            failed.append(f"{name}: {type(err).__name__}: {err}")
    return failed


def compile_loaded(site: Path) -> None:
    """Write bytecode for every loaded module whose source is in site-packages.

    Unchecked hash-based pycs (PEP 552): Python uses them without comparing the source's mtime
    with the one recorded in the pyc. The venv never changes in the image, and copying it into
    the runtime stage rounds mtimes to whole seconds, which would make timestamp pycs stale:
    compiled again, in memory, at every start.
    """
    sources = {
        Path(m.__spec__.origin)
        for m in list(sys.modules.values())
        if getattr(m, "__spec__", None) and m.__spec__.origin and m.__spec__.has_location
    }
    sources = {p for p in sources if p.suffix == ".py" and p.is_relative_to(site)}
    size = 0
    for source in sorted(sources):
        pyc = py_compile.compile(
            str(source),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        size += Path(pyc).stat().st_size
    print(f"slim: bytecode for {len(sources)} modules ({size / 1e6:.1f} MB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pip", required=True, help="a pip that can uninstall from this venv")
    args = parser.parse_args()

    dists = {canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    unused = sorted(set(dists) - needed(dists))
    if unused:
        print("slim: uninstalling", " ".join(unused), flush=True)
        subprocess.run(
            [args.pip, "--python", sys.executable, "uninstall", "--yes", "--quiet", *unused],
            check=True,
        )
    site = Path(sysconfig.get_paths()["purelib"])
    remove_unused(site)

    sys.dont_write_bytecode = True  # compile_loaded writes it, unchecked
    failed = import_all()
    for line in failed:
        print(f"slim: cannot import {line}", file=sys.stderr)
    if failed:
        return 1
    compile_loaded(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
