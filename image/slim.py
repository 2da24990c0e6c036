"""Trim the image's venv to what nodeagent loads, then compile bytecode for exactly that.

Run by the Dockerfile's build stage with the venv's own python (so `importlib.metadata` sees the
venv's distributions), after `pip install --no-compile nodeagent`:

1. The Kubernetes client ships an asyncio twin of itself (`kubernetes.aio`, about 40 MB of
   source) and requires aiohttp and aiohttp-retry for it alone; nodeagent uses the synchronous
   client. The package directory goes, and so does every distribution that is required only
   through those two requirements of kubernetes (the walk below keeps anything another
   requirement still reaches). So do the client's typed API classes (`kubernetes.client.api`,
   23 MB): nodeagent sends every request through `ApiClient`.
2. Test suites that libraries ship inside their packages (never imported by the library).
3. Every module of nodeagent is imported and three one-shot commands run on the emulator
   (COMMANDS: they load what nodeagent imports only when used, such as structlog), and bytecode
   is written for everything that loaded (about 450 modules, 7 MB), not for the thousands of
   Kubernetes API and model modules nodeagent never loads (it calls the API through `ApiClient`
   alone). A module that does not import or a command that fails fails the build; the smoke run
   (image/smoke.sh) then exercises the agent in the built image.

Exits 1 with one line per module that does not import or command that fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata as metadata
import os
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
    # The typed API classes (CoreV1Api, ...: 23 MB of source) and their old alias package:
    # nodeagent calls the API through ApiClient alone (nodeagent/kube/transport.py), and the
    # client loads them only when one is named (kubernetes.client's lazy __getattr__). Their
    # models stay: ApiClient imports the models package.
    "kubernetes/client/api",
    "kubernetes/client/apis",
    "kubernetes/**/*_test.py",
    "kubernetes/dynamic/test_*.py",
    "websocket/tests",
]
COMMANDS = [["--simulate", "h200", c] for c in ("status", "metrics", "labels")]
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
            failed.append(f"cannot import {name}: {type(err).__name__}: {err}")
    return failed


def run_commands() -> list[str]:
    """Run COMMANDS in this process (output discarded); returns the failures."""
    from nodeagent.cli import main as nodeagent

    failed = []
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        for argv in COMMANDS:
            code = nodeagent(argv)
            if code != 0:
                failed.append(f"nodeagent {' '.join(argv)}: exit {code}")
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
    failed += [] if failed else run_commands()
    for line in failed:
        print(f"slim: {line}", file=sys.stderr)
    if failed:
        return 1
    compile_loaded(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
